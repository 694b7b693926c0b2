"""One EVAL per distinct diff of a group (``rollout.eval_dedup``).

The samples of a GRPO group often end with the same diff (a confident policy writes the same fix
eight times). EVAL is a function of the task and the diff alone (the harness rebuilds the tree from
the base commit and the diff, in a fresh sandbox), so the group evaluates each distinct diff once
and its identical samples share that result.

Guarantees:
- Keyed by the SHA-256 of the exact diff bytes, inside one group (one task): two diffs that differ in
  any byte are evaluated separately; nothing is shared across groups, tasks or policy versions, so a
  lucky pass of a flaky test is never replayed beyond the samples drawn beside it.
- Only a result the harness read in full is shared (``ok`` or ``timeout``, and for ``ok`` the runner's
  authenticated result frame: :func:`read_in_full`). After an infrastructure failure, or a runner that ended
  without its frame (killed by the step's SIGTERM before the node heard it, by the OOM killer, or by the
  code under test), the next sample with that diff evaluates again: one interrupted run never becomes
  the reward of every sample that wrote the same fix.
- A second worker that meets a diff being evaluated waits for that result instead of running the
  tests twice (it holds no CPU while it waits).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from hpc.trajectory import Status
from rollout_node.pipeline.bindings import EvalOutcome


@dataclass
class _Entry:
    lock: threading.Lock = field(default_factory=threading.Lock)
    outcome: EvalOutcome | None = None


def read_in_full(outcome: EvalOutcome) -> bool:
    """Shareable with the group's identical diffs: the harness's own verdict, a run past its time limit or one
    scored from the runner's whole result frame (the bindings' ``results_read``; not a runner that ended
    without it)."""
    if outcome.status.infrastructure:
        return False
    return outcome.status == Status.TIMEOUT or bool(outcome.details.get("results_read", True))


class SharedEvals:
    """The EVAL results of one group, by diff."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def evaluate(self, diff: str, run: Callable[[], EvalOutcome]) -> tuple[EvalOutcome, bool]:
        """(the outcome for ``diff``, whether it was shared rather than run here); an outcome not
        :func:`read_in_full` is returned to its own sample only."""
        key = hashlib.sha256(diff.encode("utf-8", errors="surrogateescape")).hexdigest()
        with self._lock:
            entry = self._entries.setdefault(key, _Entry())
        with entry.lock:
            if entry.outcome is not None:
                return entry.outcome, True
            outcome = run()
            if read_in_full(outcome):
                entry.outcome = outcome
            return outcome, False

    def __len__(self) -> int:
        """Distinct diffs with a shared result."""
        with self._lock:
            return sum(e.outcome is not None for e in self._entries.values())
