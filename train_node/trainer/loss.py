"""The clipped policy-gradient objective over token IDs (GRPO/DAPO family).

Guarantees:
- Only tokens with ``mask == 1`` (the policy's own generated tokens) contribute.
- Token-level aggregation: the loss of one micro-batch is ``sum(per_token_loss * mask) / total_tokens``,
  where ``total_tokens`` is the number of loss tokens of the whole optimizer step on all ranks. Summing
  the micro-batch losses of all ranks therefore gives the mean over every loss token of the step,
  independent of how the tokens were packed or split across ranks.
- Policy log-probabilities are taken at the sampling temperature (``logits / T``), so they are
  comparable with the behaviour log-probabilities the inference engine recorded while sampling.

Per token, with ``r = exp(logp - logp_behaviour)`` and advantage ``A``:

    pg = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))   (asymmetric PPO clip, DAPO clip-higher)
    pg = min(pg, -A * tis_cap)  where A < 0                         (truncated importance weight)

The ratio is taken against the *behaviour* policy (the version that generated the token), so the
clip bounds how far one update moves away from it, and samples several versions old are corrected
by their importance weight. For A > 0 the clip already bounds the weight at ``1 + clip_high``; for
A < 0 the unclipped branch grows with ``r`` without bound, which ``tis_cap`` truncates (the
"dual clip"). Optional KL penalty against a frozen reference (k3 estimator, always >= 0):

    kl = exp(logp_ref - logp) - (logp_ref - logp) - 1;   per_token = pg + kl_coef * kl
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# exp() of a log-ratio beyond this is numerically meaningless (and the clip decides anyway).
_MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class LossParams:
    """The objective's coefficients (from ``AlgorithmConfig``)."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    tis_cap: float = 2.0
    kl_coef: float = 0.0
    advantage_sign: float = 1.0  # -1 only for the negative-control test: it must not learn


@dataclass
class LossSums:
    """Sums over the loss tokens of one micro-batch (summed again across micro-batches and ranks)."""

    loss: float = 0.0
    tokens: float = 0.0
    clipped: float = 0.0
    kl: float = 0.0
    ratio_dev: float = 0.0  # sum of |r - 1|: how off-policy the tokens were

    def add(self, other: LossSums) -> None:
        for name in ("loss", "tokens", "clipped", "kl", "ratio_dev"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor([self.loss, self.tokens, self.clipped, self.kl, self.ratio_dev], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> LossSums:
        v = [float(x) for x in t.tolist()]
        return cls(loss=v[0], tokens=v[1], clipped=v[2], kl=v[3], ratio_dev=v[4])


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, inv_temperature: torch.Tensor) -> torch.Tensor:
    """log softmax(logits / T)[target] per position, in fp32. Shapes: [N, V], [N], [N] -> [N]."""
    scaled = logits.float() * inv_temperature.unsqueeze(-1)
    picked = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


def policy_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    params: LossParams,
    total_tokens: float,
    ref_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossSums]:
    """The micro-batch loss (already divided by the step's global loss-token count) and its sums."""
    assert total_tokens > 0, "a step without loss tokens must not reach the loss"
    adv = advantages * params.advantage_sign
    log_ratio = (logp - behaviour_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1.0 - params.clip_low, 1.0 + params.clip_high)
    pg = torch.maximum(-adv * ratio, -adv * clipped_ratio)
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * params.tis_cap), pg)
    per_token = pg
    kl = torch.zeros_like(logp)
    if ref_logp is not None and params.kl_coef > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + params.kl_coef * kl
    loss = (per_token * mask).sum() / total_tokens
    with torch.no_grad():
        sums = LossSums(
            loss=float((per_token * mask).sum()),
            tokens=float(mask.sum()),
            clipped=float((_clip_active(ratio, adv, params) * mask).sum()),
            kl=float((kl * mask).sum()),
            ratio_dev=float(((ratio - 1.0).abs() * mask).sum()),
        )
    return loss, sums


def _clip_active(ratio: torch.Tensor, adv: torch.Tensor, params: LossParams) -> torch.Tensor:
    """1.0 where a clip (or the truncation) zeroes the token's gradient."""
    high = (adv > 0) & (ratio > 1.0 + params.clip_high)
    low = (adv < 0) & (ratio < 1.0 - params.clip_low)
    trunc = (adv < 0) & (ratio > params.tis_cap)
    return (high | low | trunc).float()


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
