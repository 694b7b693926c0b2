"""The rollout node's staleness guard: the margin counts the whole versions expected during EVAL."""

from __future__ import annotations

import pytest

from rollout_node.pipeline import staleness as staleness_mod
from rollout_node.pipeline.staleness import StalenessGuard


def test_the_guard_counts_only_whole_versions_expected_during_eval(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.75 versions expected during EVAL is no version: at max_staleness 1 a sample one version behind keeps
    running (rounded up, the margin was 1 and it was cancelled); 2.3 expected is 2, capped at the limit."""
    now, latest = [100.0], [5]
    monkeypatch.setattr(staleness_mod.time, "monotonic", lambda: now[0])
    guard = StalenessGuard(1, lambda: latest[0], lambda: 2.5)
    assert guard.margin() == 0  # no version change seen yet
    now[0], latest[0] = 110.0, 8  # 0.3 versions/s x 2.5 s of EVAL = 0.75
    assert guard.margin() == 0
    assert not guard.too_stale(7)  # one version behind: within the limit when the trainer sees it
    assert guard.too_stale(6)  # two behind: over it already
    now[0], latest[0] = 112.0, 16  # 11 versions in 12 s x 2.5 s = 2.3 -> 2, capped at max_staleness 1
    assert guard.margin() == 1
    assert guard.too_stale(15)
    assert not guard.too_stale(None)  # nothing generated yet: never stale
    no_eval = StalenessGuard(1, lambda: latest[0], lambda: None)
    assert no_eval.margin() == 0
