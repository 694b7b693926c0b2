"""The policy-gradient objective over token IDs: REINFORCE with a baseline + truncated token-level IS + KL.

Guarantees:
- Only tokens with ``mask == 1`` (the policy's own generated tokens) contribute.
- Token-level aggregation: the loss of one micro-batch is ``sum(per_token_loss * mask) / total_tokens``,
  where ``total_tokens`` is the number of loss tokens of the whole optimizer update on all ranks. Summing
  the micro-batch losses of all ranks therefore gives the mean over every loss token of the step,
  independent of how the tokens were packed or split across ranks.
- One distribution end to end: policy log-probabilities are ``log_softmax(logits / T)`` in fp32 at the
  sampling temperature, the same quantity the inference engines record (``processed`` logprobs), so an
  on-policy token has ``pi / mu == 1`` at any temperature.

What it is: REINFORCE with a baseline (the advantage), token-level truncated importance sampling
against the behaviour policy (veRL's TIS) and an optional KL penalty. Per token, with the behaviour
policy ``mu`` (the version that sampled the token), the proximal policy ``pi_prox`` (the weights at the
start of the trainer step) and advantage ``A``:

    w  = min(pi_prox / mu, tis_cap)                    detached truncated importance weight
    rp = pi / pi_prox                                  the ratio the PPO clip bounds
    pg = w * max(-A * rp, -A * clip(rp, 1 - clip_low, 1 + clip_high))

With one optimizer update per batch (``algorithm.minibatches`` 1, the default) the proximal policy is
the current one (``pi_prox = logp.detach()``, ``rp == 1`` in value), the clip cannot bind and the
gradient is exactly ``-A * w * grad(log pi)``: stale samples are re-weighted towards the current
policy, and the weight is truncated at ``tis_cap`` so that one token can never dominate (veRL
truncates like this; AReaL instead drops tokens above its cap). With ``minibatches`` k > 1 the step
makes k updates, ``pi_prox`` is computed once before the first (AReaL's ``ppo_n_minibatches``), and
from the second update on the clip bounds the move away from it (``clipped`` counts where it binds).

Optional KL penalty against a frozen reference, always >= 0, by ``kl_estimator``: ``k3`` from the
sampled token, clamped as veRL and OpenRLHF do so that one token the policy has left far behind
(a stale sample, ``pi << ref``) gives a bounded term instead of ``inf``:

    d  = clamp(logp_ref - logp, -20, 20);   kl = min(exp(d) - d - 1, 10);   per_token = pg + kl_coef * kl

or ``forward``, the exact KL(ref || pi) over the vocabulary at the position (:func:`forward_kl`, which
the engine computes alongside the logprobs). Both have the same expected gradient on-policy: k3's
gradient ``(1 - ref/pi) grad(log pi)`` averages under ``pi`` to that of KL(ref || pi), whose gradient
on the logits is ``(pi - pi_ref) / T`` (for k3 only below its cap: a token with ``ref / pi`` above ~12.7
reaches the cap of 10 and gets no pull). ``forward`` is the exact (zero-variance) form: a token the
policy rarely samples is pulled back at every position, not by a rare huge k3 term when it is sampled.
(Off-policy, k3 is not importance-weighted; the logged ``kl`` under k3 estimates KL(pi || ref).)

Statistics per staleness bucket (0, 1, 2, 3+ versions) report how off-policy the step was: tokens,
``sum |pi/mu - 1|``, the share truncated at ``tis_cap`` and the mean weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hpc.config import AlgorithmConfig

# exp() of a log-ratio beyond this is numerically meaningless (and the truncation decides anyway).
_MAX_LOG_RATIO = 20.0
# k3's bounds, as veRL (kl_penalty 'low_var_kl') and OpenRLHF (compute_approx_kl 'k3') clamp it
K3_MAX_LOG_RATIO = 20.0
K3_MAX = 10.0
STALENESS_BUCKETS = 4  # 0, 1, 2, 3+ versions
_SCALARS = ("loss", "tokens", "clipped", "truncated", "kl", "ratio_dev", "weight")
_BUCKETED = ("b_tokens", "b_ratio_dev", "b_truncated", "b_weight")


_ALGORITHM = AlgorithmConfig()  # the defaults, stated once in hpc/config


@dataclass(frozen=True)
class LossParams:
    """The objective's coefficients (``algorithm.*``; a field left out takes the config's default)."""

    clip_low: float = _ALGORITHM.clip_low
    clip_high: float = _ALGORITHM.clip_high
    tis_cap: float = _ALGORITHM.tis_cap
    kl_coef: float = _ALGORITHM.kl_coef
    kl_estimator: str = _ALGORITHM.kl_estimator

    @classmethod
    def from_config(cls, cfg: AlgorithmConfig) -> LossParams:
        return cls(clip_low=cfg.clip_low, clip_high=cfg.clip_high, tis_cap=cfg.tis_cap, kl_coef=cfg.kl_coef,
                   kl_estimator=cfg.kl_estimator)


def _zeros() -> list[float]:
    return [0.0] * STALENESS_BUCKETS


@dataclass
class LossSums:
    """Sums over the loss tokens of one micro-batch (summed again across micro-batches and ranks)."""

    loss: float = 0.0
    tokens: float = 0.0
    clipped: float = 0.0    # tokens where the PPO clip around the proximal policy zeroes the gradient
    truncated: float = 0.0  # tokens whose importance weight pi/mu was truncated at tis_cap
    kl: float = 0.0
    ratio_dev: float = 0.0  # sum of |pi/mu - 1|: how off-policy the tokens were
    weight: float = 0.0     # sum of the truncated importance weights
    b_tokens: list[float] = field(default_factory=_zeros)
    b_ratio_dev: list[float] = field(default_factory=_zeros)
    b_truncated: list[float] = field(default_factory=_zeros)
    b_weight: list[float] = field(default_factory=_zeros)

    def add(self, other: LossSums) -> None:
        for name in _SCALARS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in _BUCKETED:
            setattr(self, name, [a + b for a, b in zip(getattr(self, name), getattr(other, name), strict=True)])

    def as_tensor(self) -> torch.Tensor:
        flat = [getattr(self, n) for n in _SCALARS] + [x for n in _BUCKETED for x in getattr(self, n)]
        return torch.tensor(flat, dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> LossSums:
        v = [float(x) for x in t.tolist()]
        k, out = len(_SCALARS), cls()
        for name, value in zip(_SCALARS, v, strict=False):
            setattr(out, name, value)
        for i, name in enumerate(_BUCKETED):
            setattr(out, name, v[k + i * STALENESS_BUCKETS: k + (i + 1) * STALENESS_BUCKETS])
        return out

    def by_staleness(self) -> dict[str, dict[str, float]]:
        """Per bucket with tokens: token count, mean |pi/mu - 1|, truncated share, mean weight."""
        out = {}
        for b in range(STALENESS_BUCKETS):
            n = self.b_tokens[b]
            if n > 0:
                label = f"{b}+" if b == STALENESS_BUCKETS - 1 else str(b)
                out[label] = {"tokens": n, "ratio_dev": self.b_ratio_dev[b] / n,
                              "truncated_fraction": self.b_truncated[b] / n, "weight_mean": self.b_weight[b] / n}
        return out


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, inv_temperature: torch.Tensor) -> torch.Tensor:
    """log softmax(logits / T)[target] per position, in fp32. Shapes: [N, V], [N], [N] -> [N]."""
    scaled = logits.float() * inv_temperature.unsqueeze(-1)
    picked = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


def forward_kl(logits: torch.Tensor, ref_logits: torch.Tensor, inv_temperature: torch.Tensor) -> torch.Tensor:
    """KL(softmax(ref / T) || softmax(logits / T)) per position, in fp32. Shapes: [N, V], [N, V], [N] -> [N]."""
    scale = inv_temperature.unsqueeze(-1)
    mine = torch.log_softmax(logits.float() * scale, dim=-1)
    ref = torch.log_softmax(ref_logits.float() * scale, dim=-1)
    return (ref.exp() * (ref - mine)).sum(-1)


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 per token, ``exp(d) - d - 1`` with ``d = log ref - log pi`` clamped to
    +-:data:`K3_MAX_LOG_RATIO` and the value to at most :data:`K3_MAX` (never inf; beyond the bounds
    the term carries no gradient, as in veRL and OpenRLHF)."""
    delta = (ref_logp - logp).clamp(-K3_MAX_LOG_RATIO, K3_MAX_LOG_RATIO)
    return (torch.exp(delta) - delta - 1.0).clamp(max=K3_MAX)


def policy_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    params: LossParams,
    total_tokens: float,
    ref_logp: torch.Tensor | None = None,
    staleness: torch.Tensor | None = None,
    forward_kl_tokens: torch.Tensor | None = None,
    prox_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossSums]:
    """The micro-batch loss (already divided by the update's global loss-token count) and its sums.

    The KL term: ``k3`` from ``ref_logp`` (:func:`k3`); ``forward`` takes the per-token :func:`forward_kl`
    (``forward_kl_tokens``, carrying its gradient) instead. ``prox_logp``: the proximal policy's logprobs
    (``algorithm.minibatches`` > 1); None: the current ones, ``logp.detach()``."""
    assert total_tokens > 0, "a step without loss tokens must not reach the loss"
    prox = logp.detach() if prox_logp is None else prox_logp
    ratio = torch.exp((prox - behaviour_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))  # pi_prox / mu
    weight = ratio.clamp(max=params.tis_cap)
    prox_ratio = torch.exp(logp - prox)
    clipped_ratio = prox_ratio.clamp(1.0 - params.clip_low, 1.0 + params.clip_high)
    pg = weight * torch.maximum(-advantages * prox_ratio, -advantages * clipped_ratio)
    per_token = pg
    kl = torch.zeros_like(logp)
    if params.kl_coef > 0 and params.kl_estimator == "forward":
        assert forward_kl_tokens is not None, "kl_estimator 'forward' needs the per-token forward KL"
        kl = forward_kl_tokens
        per_token = per_token + params.kl_coef * kl
    elif ref_logp is not None and params.kl_coef > 0:
        kl = k3(logp, ref_logp)
        per_token = per_token + params.kl_coef * kl
    loss = (per_token * mask).sum() / total_tokens
    with torch.no_grad():
        sums = _sums(per_token, mask, ratio, weight, _clip_active(prox_ratio, advantages, params), kl, params, staleness)
    return loss, sums


def _sums(per_token: torch.Tensor, mask: torch.Tensor, ratio: torch.Tensor, weight: torch.Tensor,
          clipped: torch.Tensor, kl: torch.Tensor, params: LossParams, staleness: torch.Tensor | None) -> LossSums:
    dev, trunc = (ratio - 1.0).abs(), (ratio > params.tis_cap).float()
    sums = LossSums(loss=float((per_token * mask).sum()), tokens=float(mask.sum()),
                    clipped=float((clipped * mask).sum()), truncated=float((trunc * mask).sum()),
                    kl=float((kl * mask).sum()), ratio_dev=float((dev * mask).sum()),
                    weight=float((weight * mask).sum()))
    bucket = (torch.zeros_like(mask, dtype=torch.long) if staleness is None
              else staleness.long().clamp(0, STALENESS_BUCKETS - 1))
    for name, values in (("b_tokens", mask), ("b_ratio_dev", dev * mask), ("b_truncated", trunc * mask),
                         ("b_weight", weight * mask)):
        acc = torch.zeros(STALENESS_BUCKETS, dtype=torch.float64).index_add_(0, bucket.cpu(), values.double().cpu())
        setattr(sums, name, acc.tolist())
    return sums


def _clip_active(prox_ratio: torch.Tensor, adv: torch.Tensor, params: LossParams) -> torch.Tensor:
    """1.0 where the PPO clip around the proximal policy zeroes the token's gradient."""
    high = (adv > 0) & (prox_ratio > 1.0 + params.clip_high)
    low = (adv < 0) & (prox_ratio < 1.0 - params.clip_low)
    return (high | low).float()


def group_advantages(rewards: list[float], norm: str, eps: float = 1e-6) -> list[float]:
    """Group-normalised advantages: ``r - mean`` ('group_mean') or ``(r - mean) / (std + eps)`` ('group_std').

    The std is the population std of the group (divides by n), so a group of two gives +-1.
    """
    n = len(rewards)
    assert n > 0
    mean = sum(rewards) / n
    centred = [r - mean for r in rewards]
    if norm == "group_mean":
        return centred
    std = (sum(c * c for c in centred) / n) ** 0.5
    return [c / (std + eps) for c in centred]


def batch_advantages(groups: list[list[float]], norm: str, eps: float = 1e-6) -> list[list[float]]:
    """One baseline for every reward of the step, returned group by group: ``r - mean`` ('batch_mean') or
    ``(r - mean) / (std + eps)`` ('batch_std', REINFORCE++'s global normalisation); population std, as above.

    Unlike a group baseline it keeps the signal of a group whose samples all scored the same: all failed,
    their answers are pushed down (a value the policy has abandoned for one kind of statement is not left
    without a gradient); all passed, theirs are pushed up. 'batch_std' divides by a std that shrinks as the
    step's rewards saturate: one failure among 31 passes gets -5.6, against -0.97 under 'batch_mean'.

    Without a per-prompt baseline every prompt adds ``(V(prompt) - mean)`` to its samples' advantages: zero in
    expectation, but variance. That is small when the steps are stratified (tasks of equal difficulty in every
    step, as in the demo); on real task sets, whose pass rates differ per task, a group baseline fits."""
    flat = [r for g in groups for r in g]
    assert flat and norm in ("batch_mean", "batch_std")
    mean = sum(flat) / len(flat)
    scale = 1.0 if norm == "batch_mean" else (sum((r - mean) ** 2 for r in flat) / len(flat)) ** 0.5 + eps
    return [[(r - mean) / scale for r in g] for g in groups]


def step_advantages(groups: list[list[float]], norm: str) -> list[list[float]]:
    """The advantages of a step's groups under ``algorithm.advantage_norm``: each group's own baseline
    ('group_*') or one for the whole step ('batch_*')."""
    if norm in ("batch_mean", "batch_std"):
        return batch_advantages(groups, norm)
    return [group_advantages(g, norm) for g in groups]
