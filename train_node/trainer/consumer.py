"""Rank 0's spool consumer: shards in, batches of complete, trainable, deduplicated groups out.

Guarantees (exactly-once accounting):
- Every row of every claimed shard gets exactly one outcome in the ledger: ``trained`` (with the
  step) or ``dropped`` (with a reason: ``duplicate_task``, ``zero_variance``, ``stale``,
  ``discarded_lineage``, ``logprob_kind:KIND``, ``sampling:unsupported``, ``too_long``, ``no_reward``,
  ``singleton``, ``all_masked``, ``nonfinite`` (a whole batch whose step the non-finite guard skipped), or
  the trajectory's non-trainable status such as ``sandbox_error``).
  Rows the spool itself dropped as duplicates are entered too.
- Only what the trainer can reproduce is trained (``hpc.trajectory.training_refusal``): behaviour
  logprobs of kind ``processed`` drawn at a temperature > 0 from the full softmax.
- Whole groups are kept or dropped for staleness, refusal and discarded lineage (a per-sample drop of
  the late samples would bias the group baseline); the staleness is measured at the version that
  will train the batch. Per-sample drops remain only for what the episode itself failed at.
- ``algorithm.truncated`` / ``algorithm.timeout`` = ``mask``: such samples keep their reward in the
  baseline but contribute no loss tokens.
- A sample with several rows (a harness episode's segments share its ``sample_index``) counts once:
  group completeness, the singleton rule and the advantage baseline see its one reward, and each
  of its rows is trained with that sample's advantage.
- ``algorithm.advantage_norm``: advantages are computed when the batch is made, each group's own
  baseline (``group_*``) or one over every sample of the batch (``batch_*``); rank 0 makes the whole
  step's batch, so every rank trains with the same baseline.
- A shard is *covered* once all its rows have an outcome; covered shard ids go into the next
  checkpoint and are committed after it. Rows of a shard not yet covered whose outcome is already
  decided are remembered per shard (``resolved``, saved in the checkpoint), so when the shard comes
  back after a crash those rows are skipped instead of being counted twice.
- A task id is trained at most once in the lineage: the sets of trained and of dropped task ids
  (the feeder's resolutions, :meth:`Consumer.is_resolved`) are part of the checkpoint; tasks in a batch not yet trained are held separately (``inflight``) and are not saved.
- Deterministic: shards are claimed in arrival order (:mod:`hpc.arrival`) and groups leave the
  buffer in arrival order.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpc.config import AlgorithmConfig
from hpc.spool import ConsumerSpool, Shard
from hpc.trajectory import Status, Trajectory, training_refusal
from train_node.trainer.loss import step_advantages
from train_node.trainer.packing import Sample


@dataclass
class Batch:
    """One optimizer step's worth of groups (samples carry their advantages)."""

    samples: list[Sample]
    groups: list[list[Trajectory]]
    staleness: list[int]
    policy_version: int  # trainer version the batch was filtered against
    shard_of: dict[str, str] = field(default_factory=dict)  # trajectory id -> shard id
    masked: int = 0  # samples trained with no loss tokens (algorithm.truncated / timeout: mask)

    @property
    def task_ids(self) -> list[str]:
        return [g[0].task_id for g in self.groups]

    @property
    def rewards(self) -> list[float]:
        return [float(t.reward or 0.0) for g in self.groups for t in g]


@dataclass
class ConsumerState:
    """What the checkpoint keeps of the consumer."""

    trained_tasks: set[str] = field(default_factory=set)
    dropped_tasks: set[str] = field(default_factory=set)  # groups dropped as a whole (the feeder's resolutions)
    resolved: dict[str, set[str]] = field(default_factory=dict)  # shard id -> trajectory ids with an outcome
    tasks_resolved: int = 0  # groups trained or dropped as a whole (the feeder's backpressure)
    # policy versions [lo, hi] published by steps a resume discarded: their samples are not this lineage's
    discarded_versions: list[tuple[int, int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"trained_tasks": sorted(self.trained_tasks), "tasks_resolved": self.tasks_resolved,
                "dropped_tasks": sorted(self.dropped_tasks),
                "resolved": {k: sorted(v) for k, v in sorted(self.resolved.items())},
                "discarded_versions": [list(r) for r in self.discarded_versions]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ConsumerState:
        return cls(trained_tasks=set(data.get("trained_tasks", [])), tasks_resolved=int(data.get("tasks_resolved", 0)),
                   dropped_tasks=set(data.get("dropped_tasks", [])),
                   resolved={k: set(v) for k, v in data.get("resolved", {}).items()},
                   discarded_versions=[(int(lo), int(hi)) for lo, hi in data.get("discarded_versions", [])])

    def discarded(self, t: Trajectory) -> bool:
        """True when a generated token of ``t`` comes from a version of a discarded lineage."""
        pv = t.policy_versions[t.loss_mask == 1]
        return any(bool(((pv >= lo) & (pv <= hi)).any()) for lo, hi in self.discarded_versions)


@dataclass
class _Staged:
    """A group that passed the filters, waiting for a batch."""

    members: list[tuple[str, Trajectory]]
    rewards: list[float]  # per sample; the advantages are computed when the batch is made (a 'batch_*' baseline spans it)
    staleness: list[int]
    sample_of: list[int]  # member -> its sample's position in ``rewards`` (a sample's segments share one)


@dataclass
class _Open:
    """A claimed shard whose rows are not all resolved yet."""

    total: int
    done: set[str] = field(default_factory=set)


class Consumer:
    """Not thread-safe by itself: the batch source serialises calls with ``lock``."""

    def __init__(self, spool: ConsumerSpool, consumer_id: str, acfg: AlgorithmConfig, *, max_seq_len: int,
                 state: ConsumerState | None = None, claim_batch: int = 8) -> None:
        self.spool, self.consumer_id, self.acfg = spool, consumer_id, acfg
        self.max_seq_len = max_seq_len
        self.claim_batch = claim_batch
        self.state = state or ConsumerState()
        self.lock = threading.RLock()
        self.open: dict[str, _Open] = {}
        self.groups: OrderedDict[tuple[str, str], list[tuple[str, Trajectory]]] = OrderedDict()
        self.inflight: set[str] = set()
        self.staged: list[_Staged] = []
        # sample indices of a group decided before a restart (a sample may have several rows: segments)
        self.group_done: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
        self.ledger: list[dict[str, Any]] = []  # outcomes since the last checkpoint
        self.covered: list[str] = []  # shards fully resolved since the last checkpoint
        self.drops: Counter[str] = Counter()
        self.shards_claimed = 0

    # ------------------------------------------------------------------ intake
    def poll(self) -> int:
        """Claim ready shards and buffer their rows; returns the number of shards claimed."""
        shards = self.spool.claim_shards(self.consumer_id, self.claim_batch)
        for shard in shards:
            self._intake(shard)
        self.shards_claimed += len(shards)
        return len(shards)

    def _intake(self, shard: Shard) -> None:
        sid = shard.shard_id
        already = self.state.resolved.get(sid, set())
        entry = self.open[sid] = _Open(total=0, done=set(already))
        for row in shard.dropped:
            entry.total += 1
            if row["trajectory_id"] not in already:
                self._resolve(sid, row["trajectory_id"], row["task_id"], "dropped", row.get("reason", "duplicate_task"))
        for traj in shard.trajectories():
            entry.total += 1
            key = (traj.task_id, traj.group_id)
            if traj.trajectory_id in already:
                self.group_done[key].add(traj.sample_index)  # decided before a restart; still counts
                continue
            self.groups.setdefault(key, []).append((sid, traj))
        self._maybe_cover(sid)

    # ------------------------------------------------------------------ outcomes
    def _resolve(self, sid: str, traj_id: str, task_id: str, outcome: str, reason: str = "",
                 step: int | None = None) -> None:
        entry: dict[str, Any] = {"trajectory_id": traj_id, "task_id": task_id, "shard_id": sid, "outcome": outcome}
        if reason:
            entry["reason"] = reason
            self.drops[reason] += 1
        if step is not None:
            entry["step"] = step
        self.ledger.append(entry)
        self.open[sid].done.add(traj_id)
        self.state.resolved.setdefault(sid, set()).add(traj_id)

    def _maybe_cover(self, sid: str) -> None:
        entry = self.open[sid]
        if len(entry.done) >= entry.total:
            del self.open[sid]
            self.state.resolved.pop(sid, None)
            self.covered.append(sid)

    def _drop_all(self, members: list[tuple[str, Trajectory]], reason: str) -> None:
        for sid, t in members:
            self._resolve(sid, t.trajectory_id, t.task_id, "dropped", reason)
            self._maybe_cover(sid)

    # ------------------------------------------------------------------ batching
    def next_batch(self, trainer_version: int, num_groups: int, *, allow_partial: bool = False) -> Batch | None:
        """``num_groups`` trainable groups in arrival order (fewer only with ``allow_partial``), else None."""
        for key in [k for k in self.groups if self._complete(k)]:
            if len(self.staged) >= num_groups:
                break
            self.group_done.pop(key, None)
            kept = self._filter_group(self.groups.pop(key), trainer_version)
            if kept is not None:
                self.staged.append(kept)
        if not self.staged or (len(self.staged) < num_groups and not allow_partial):
            return None
        picked, self.staged = self.staged[:num_groups], self.staged[num_groups:]
        return self._make_batch(picked, trainer_version)

    def _complete(self, key: tuple[str, str]) -> bool:
        """``group_size`` samples arrived; a sample's segments (a harness episode) count once."""
        return len({t.sample_index for _, t in self.groups[key]} | self.group_done[key]) >= self.acfg.group_size

    def _filter_group(self, members: list[tuple[str, Trajectory]], version: int) -> _Staged | None:
        """Drop what must not be trained; returns the kept members with their rewards, or None."""
        task_id = members[0][1].task_id
        if task_id in self.state.trained_tasks or task_id in self.inflight:
            self._drop_group(members, "duplicate_task", task_id)
            return None
        kept = []
        for sid, t in members:
            reason = self._sample_drop_reason(t)
            if reason:
                self._drop_all([(sid, t)], reason)
            else:
                kept.append((sid, t))
        reason = self._group_drop_reason([t for _, t in kept], version)
        if reason:
            self._drop_group(kept, reason, task_id)
            return None
        samples = sorted({t.sample_index for _, t in kept})  # a sample's segments share its reward
        if len(samples) < 2 and self.acfg.group_size > 1:
            self._drop_group(kept, "singleton", task_id)
            return None
        reward_of = {t.sample_index: float(t.reward or 0.0) for _, t in kept}
        rewards = [reward_of[i] for i in samples]
        if self.acfg.drop_zero_variance and max(rewards) == min(rewards):
            self._drop_group(kept, "zero_variance", task_id)
            return None
        if all(self._masked(t) for _, t in kept):
            self._drop_group(kept, "all_masked", task_id)
            return None
        self.inflight.add(task_id)
        return _Staged(kept, rewards, [t.staleness(version) for _, t in kept],
                       [samples.index(t.sample_index) for _, t in kept])

    def _group_drop_reason(self, kept: list[Trajectory], version: int) -> str:
        """Reasons that drop the whole group (see the module docstring)."""
        for t in kept:
            refusal = training_refusal(t.logprob_kind, t.sampling)
            if refusal:
                return refusal
        if any(self.state.discarded(t) for t in kept):
            return "discarded_lineage"
        if any(t.staleness(version) > self.acfg.max_staleness for t in kept):
            return "stale"
        return ""

    def _masked(self, t: Trajectory) -> bool:
        """Trained with no loss tokens: its ending is configured as ``mask``."""
        return (t.status == Status.TRUNCATED and self.acfg.truncated == "mask") or \
            (t.status == Status.TIMEOUT and self.acfg.timeout == "mask")

    def _drop_group(self, members: list[tuple[str, Trajectory]], reason: str, task_id: str) -> None:
        self._drop_all(members, reason)
        self.state.tasks_resolved += 1
        self.state.dropped_tasks.add(task_id)

    def _sample_drop_reason(self, t: Trajectory) -> str:
        if not t.status.trainable:
            return t.status.value
        if t.reward is None:
            return "no_reward"
        if t.num_tokens > self.max_seq_len:
            return "too_long"
        if t.num_generated == 0:
            return "no_generated_tokens"
        return ""

    def _make_batch(self, picked: list[_Staged], version: int) -> Batch:
        batch = Batch(samples=[], groups=[], staleness=[], policy_version=version)
        advantages = step_advantages([st.rewards for st in picked], self.acfg.advantage_norm)
        for st, group_adv in zip(picked, advantages, strict=True):
            batch.groups.append([t for _, t in st.members])
            batch.staleness.extend(st.staleness)
            for (sid, t), k, stale in zip(st.members, st.sample_of, st.staleness, strict=True):
                a = group_adv[k]
                temp = float(t.sampling["temperature"])  # training_refusal guarantees a finite T > 0
                mask = np.zeros_like(t.loss_mask) if self._masked(t) else t.loss_mask
                batch.samples.append(Sample(t.trajectory_id, t.token_ids, mask, t.logprobs, a, temp, stale))
                batch.shard_of[t.trajectory_id] = sid
                batch.masked += int(self._masked(t))
        return batch

    def mark_trained(self, batch: Batch, step: int) -> None:
        for group in batch.groups:
            self.state.trained_tasks.add(group[0].task_id)
            self.state.tasks_resolved += 1
            self.inflight.discard(group[0].task_id)
            for t in group:
                sid = batch.shard_of[t.trajectory_id]
                self._resolve(sid, t.trajectory_id, t.task_id, "trained", step=step)
                self._maybe_cover(sid)

    def drop_batch(self, batch: Batch, reason: str) -> None:
        """A batch that will not be trained (its step applied nothing): every group dropped as a whole."""
        for group in batch.groups:
            self.inflight.discard(group[0].task_id)
            self._drop_group([(batch.shard_of[t.trajectory_id], t) for t in group], reason, group[0].task_id)

    # ------------------------------------------------------------------ checkpoint hand-off
    def complete_groups(self) -> int:
        return len(self.staged) + sum(1 for k in self.groups if self._complete(k))

    def drop_incomplete(self) -> int:
        """At the end of a drain: groups still short of ``group_size`` will never complete; drop them."""
        keys = [k for k in self.groups if not self._complete(k)]
        for key in keys:
            self.group_done.pop(key, None)
            self._drop_group(self.groups.pop(key), "incomplete_group", key[0])
        return len(keys)

    def is_resolved(self, task_id: str) -> bool:
        """The task's group was trained or dropped as a whole in this lineage."""
        return task_id in self.state.trained_tasks or task_id in self.state.dropped_tasks

    def held_tasks(self) -> set[str]:
        """Tasks with rows buffered here, or staged / in a batch not yet marked trained."""
        return {key[0] for key in self.groups} | self.inflight

    def has_delta(self) -> bool:
        """Outcomes or covered shards not yet in a checkpoint."""
        return bool(self.ledger or self.covered)

    def take_checkpoint_delta(self) -> tuple[list[dict[str, Any]], list[str], dict[str, Any]]:
        """(ledger since the last checkpoint, shards it covers, state to save); resets the deltas."""
        ledger, covered = self.ledger, self.covered
        self.ledger, self.covered = [], []
        return ledger, covered, self.state.to_json()
