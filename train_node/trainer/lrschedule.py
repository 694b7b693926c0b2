"""The learning rate of each step: the linear warm-up times a KL-adaptive scale (``trainer.target_kl``).

Why the KL controller: an optimizer step of Adam is sign-like while its second moments are young, so
its size in parameter space is about ``lr`` per weight whatever the gradient says, and its size in
policy space can be anything. Measured on the demo (issue 12): at ``lr`` 3e-4 one early step moved
the answer of every builtin-pick statement from uniform to ~0.84 on one value (about 2 nats at that
token), and the next step swung it onto another value. The controller measures how far each step
moved the policy, on the batch it trained (:func:`kl_totals`), and scales the next step's ``lr``
so that the distance stays near the target: the adaptive schedule of rsl_rl's PPO (``desired_kl``),
a trust region without a second model or a line search.

Units: nats per loss token (:func:`mean_token_kl`: the KL summed over the step's loss tokens divided by
their number; samples trained with no loss tokens count for nothing). A per-sample sum would make one
target mean 40x less per token on a 40-token episode than on a 10,000-token one, and drive the lr to its
floor on long trajectories.

Guarantees:
- ``trainer.target_kl`` 0 (the default) leaves the schedule as it was: the warm-up alone.
- The scale starts at :data:`START_SCALE` (the first steps, the most sign-like, are small), is divided
  by :data:`FACTOR` after a step that moved more than twice the target and multiplied by it after one
  that moved less than half, within [:data:`MIN_SCALE`, 1]: ``trainer.lr`` stays the peak.
- A step with no policy-gradient signal (every advantage 0: all the step's rewards equal under a step-wide
  baseline, every group's under a group one) leaves the scale as it was. Its KL is the KL penalty's alone, so
  it says nothing of how far a real step at this lr would go: measured on the demo, five all-pass steps grew
  the lr to its peak and the first failure after them (advantage -5.6 under ``batch_std``) moved the policy by
  13.8 nats per sample.
- The scale is part of the scheduler's state (a callable object's ``__dict__`` is what
  ``LambdaLR.state_dict`` saves), so DeepSpeed's checkpoint carries it and a resume continues exactly.
"""

from __future__ import annotations

import torch

FACTOR = 1.5
START_SCALE = FACTOR**-6  # ~0.09: the controller grows it to 1 in six quiet steps
MIN_SCALE = 1e-3


class LrSchedule:
    """LambdaLR's factor for step ``s``: ``warm-up(s) * scale``."""

    def __init__(self, warmup_steps: int, target_kl: float) -> None:
        self.warmup_steps = warmup_steps
        self.target_kl = target_kl
        self.scale = START_SCALE if target_kl > 0 else 1.0

    def __call__(self, step: int) -> float:
        warm = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        return warm * self.scale

    def observe(self, kl: float) -> None:
        """Adapt the scale to the KL the last step caused (no-op when the controller is off)."""
        if self.target_kl <= 0:
            return
        if kl > 2.0 * self.target_kl:
            self.scale = max(self.scale / FACTOR, MIN_SCALE)
        elif kl < 0.5 * self.target_kl:
            self.scale = min(self.scale * FACTOR, 1.0)


def apply_now(scheduler: torch.optim.lr_scheduler.LambdaLR, schedule: LrSchedule) -> float:
    """Set the optimizer's lr for the next step from the schedule as it is now (the scheduler computed it
    inside the optimizer step, before the step's KL was known); returns that lr."""
    step = scheduler.last_epoch
    lrs = [float(base) * schedule(step) for base in scheduler.base_lrs]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = list(lrs)  # type: ignore[assignment]  # what get_last_lr() reports
    return float(lrs[0])


def sequence_kl(old_logp: torch.Tensor, new_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over the loss tokens of KL(before || after the step), k3 estimator on the sampled tokens
    (``r - 1 - log r`` with ``r = pi_after / pi_before``: unbiased for tokens drawn from the policy before the
    step, never negative)."""
    log_r = (new_logp - old_logp).double()
    return ((torch.exp(log_r) - 1.0 - log_r) * mask.double()).sum()


def kl_totals(old_logp: torch.Tensor, new_logp: torch.Tensor, mask: torch.Tensor,
              advantages: torch.Tensor) -> torch.Tensor:
    """One micro-batch's [KL sum over loss tokens, loss tokens, loss tokens with a non-zero advantage] (float64):
    what the engine sums over micro-batches and ranks before :func:`mean_token_kl`."""
    loss = mask > 0
    return torch.stack([sequence_kl(old_logp, new_logp, mask), loss.double().sum(),
                        (loss & (advantages != 0)).double().sum()])


def mean_token_kl(totals: torch.Tensor) -> tuple[float, bool]:
    """(the step's KL per loss token, whether any loss token had a non-zero advantage) from summed :func:`kl_totals`."""
    return float(totals[0] / max(float(totals[1]), 1.0)), bool(totals[2] > 0)
