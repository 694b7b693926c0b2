"""Packing trainable samples into micro-batches and balancing them across ranks.

Guarantees:
- No padding: a micro-batch is the concatenation of whole sequences (``position_ids`` restart at 0
  for each one, which makes transformers build a block-diagonal causal mask), so a sequence sees
  exactly the attention it would see alone.
- Every sample lands in exactly one micro-batch of exactly one rank. Ranks get the same number of
  micro-batches (ZeRO's collectives need every rank in every forward/backward); a rank short of
  work gets empty micro-batches (one dummy token, zero loss weight).
- Deterministic: the same samples in the same order give the same plan (exact resume depends on it).
- Max-length policy: a sample longer than ``micro_batch_tokens`` gets a micro-batch of its own
  (the consumer has already dropped anything longer than ``trainer.max_seq_len``).
- Minibatches (``algorithm.minibatches``): the step's samples are split into at most k minibatches
  balanced by loss tokens, each with loss tokens (samples without any go to the lightest),
  and each minibatch is planned as above; k = 1 gives the one plan of the whole step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Sample:
    """One trainable sequence: the trajectory's tokens plus its group-normalised advantage."""

    trajectory_id: str
    token_ids: npt.NDArray[np.int32]
    loss_mask: npt.NDArray[np.int8]
    logprobs: npt.NDArray[np.float32]
    advantage: float
    temperature: float = 1.0
    staleness: int = 0  # versions between the weights that train it and its oldest token (statistics only)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_loss_tokens(self) -> int:
        # token 0 is never predicted, so its mask bit cannot count
        return int(self.loss_mask[1:].sum())


@dataclass
class MicroBatch:
    """Packed arrays for one forward pass. Per-position arrays are aligned with the *prediction* made
    at that position: ``targets[j]`` is the next token of the same sequence, ``mask[j]`` its loss bit."""

    input_ids: npt.NDArray[np.int64]
    position_ids: npt.NDArray[np.int64]
    targets: npt.NDArray[np.int64]
    mask: npt.NDArray[np.float32]
    behaviour_logprobs: npt.NDArray[np.float32]
    advantages: npt.NDArray[np.float32]
    inv_temperature: npt.NDArray[np.float32]
    staleness: npt.NDArray[np.int64]
    trajectory_ids: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids) if self.trajectory_ids else 0

    @property
    def num_loss_tokens(self) -> int:
        return int(self.mask.sum())


@dataclass
class Plan:
    """Micro-batches per rank for one optimizer step, plus packing figures."""

    per_rank: list[list[MicroBatch]]
    total_loss_tokens: int
    total_tokens: int
    capacity_tokens: int  # micro-batches (empty ones included) x micro_batch_tokens

    @property
    def packing_efficiency(self) -> float:
        return self.total_tokens / self.capacity_tokens if self.capacity_tokens else 0.0

    @property
    def rank_tokens(self) -> list[int]:
        return [sum(mb.num_tokens for mb in mbs) for mbs in self.per_rank]


def assign_ranks(samples: list[Sample], world: int) -> list[list[Sample]]:
    """Longest-processing-time first: each sample (longest first) goes to the rank with fewest tokens."""
    order = sorted(range(len(samples)), key=lambda i: (-samples[i].num_tokens, i))
    loads = [0] * world
    out: list[list[Sample]] = [[] for _ in range(world)]
    for i in order:
        r = min(range(world), key=lambda k: (loads[k], k))
        out[r].append(samples[i])
        loads[r] += samples[i].num_tokens
    return out


def first_fit_decreasing(samples: list[Sample], capacity: int) -> list[list[Sample]]:
    """Bins of total length <= capacity (an over-long sample gets a bin of its own)."""
    order = sorted(samples, key=lambda s: (-s.num_tokens, s.trajectory_id))
    bins: list[list[Sample]] = []
    room: list[int] = []
    for s in order:
        for b, free in enumerate(room):
            if s.num_tokens <= free:
                bins[b].append(s)
                room[b] -= s.num_tokens
                break
        else:
            bins.append([s])
            room.append(capacity - s.num_tokens)
    return bins


def build_micro_batch(samples: list[Sample]) -> MicroBatch:
    """Concatenate whole sequences; an empty list gives the dummy micro-batch (one token, no loss)."""
    if not samples:
        z = np.zeros(1, dtype=np.int64)
        zf = np.zeros(1, dtype=np.float32)
        return MicroBatch(z, z.copy(), z.copy(), zf, zf.copy(), zf.copy(), np.ones(1, dtype=np.float32), z.copy(), [])
    parts = [_sample_arrays(s) for s in samples]
    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return MicroBatch(
        input_ids=cat["input_ids"], position_ids=cat["position_ids"], targets=cat["targets"],
        mask=cat["mask"], behaviour_logprobs=cat["behaviour_logprobs"], advantages=cat["advantages"],
        inv_temperature=cat["inv_temperature"], staleness=cat["staleness"],
        trajectory_ids=[s.trajectory_id for s in samples],
    )


def _sample_arrays(s: Sample) -> dict[str, npt.NDArray[np.generic]]:
    n = s.num_tokens
    ids = s.token_ids.astype(np.int64)
    targets = np.zeros(n, dtype=np.int64)
    targets[:-1] = ids[1:]
    mask = np.zeros(n, dtype=np.float32)
    mask[:-1] = s.loss_mask[1:]
    behaviour = np.zeros(n, dtype=np.float32)
    behaviour[:-1] = s.logprobs[1:]
    return {
        "input_ids": ids, "position_ids": np.arange(n, dtype=np.int64), "targets": targets, "mask": mask,
        "behaviour_logprobs": behaviour, "advantages": np.full(n, s.advantage, dtype=np.float32),
        "inv_temperature": np.full(n, 1.0 / s.temperature, dtype=np.float32),
        "staleness": np.full(n, s.staleness, dtype=np.int64),
    }


def plan_step(samples: list[Sample], world: int, micro_batch_tokens: int) -> Plan:
    """Balance by tokens across ranks, pack each rank's share, equalise the micro-batch counts."""
    per_rank_samples = assign_ranks(samples, world)
    bins = [first_fit_decreasing(rs, micro_batch_tokens) for rs in per_rank_samples]
    n_micro = max(1, max(len(b) for b in bins))
    per_rank = [[build_micro_batch(b) for b in rank_bins] + [build_micro_batch([])] * (n_micro - len(rank_bins))
                for rank_bins in bins]
    total = sum(s.num_tokens for s in samples)
    return Plan(
        per_rank=per_rank,
        total_loss_tokens=sum(s.num_loss_tokens for s in samples),
        total_tokens=total,
        capacity_tokens=n_micro * world * micro_batch_tokens,
    )


def split_minibatches(samples: list[Sample], k: int) -> list[list[Sample]]:
    """At most ``k`` minibatches, balanced by loss tokens (longest first onto the lightest), then by tokens, each
    in the samples' order; minibatches that would hold no loss token are not made (fewer samples with loss
    tokens than ``k``)."""
    n_parts = max(1, min(k, sum(1 for s in samples if s.num_loss_tokens > 0)))
    loads = [(0, 0)] * n_parts
    part_of = [0] * len(samples)
    for i in sorted(range(len(samples)), key=lambda i: (-samples[i].num_loss_tokens, -samples[i].num_tokens, i)):
        m = min(range(n_parts), key=lambda j: (loads[j], j))
        part_of[i] = m
        loads[m] = (loads[m][0] + samples[i].num_loss_tokens, loads[m][1] + samples[i].num_tokens)
    return [[s for s, m in zip(samples, part_of, strict=True) if m == j] for j in range(n_parts)]


def plan_minibatches(samples: list[Sample], k: int, world: int, micro_batch_tokens: int) -> list[Plan]:
    """One :func:`plan_step` per minibatch of :func:`split_minibatches`."""
    return [plan_step(part, world, micro_batch_tokens) for part in split_minibatches(samples, k)]
