"""``scripts/bench_learning.py``'s arms: each is a valid demo config that sets what its arm claims.

A wrong key in an arm used to surface only when that arm's demo started, after the first ~12-minute arm."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from hpc.cli.demo_run import DEMO_OVERRIDES
from hpc.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_learning", ROOT / "scripts" / "bench_learning.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_learning", module)
    spec.loader.exec_module(module)
    return module


def test_each_arm_is_a_valid_demo_config_that_sets_its_regime() -> None:
    bench = _bench()
    arms = bench.arm_overrides(3, 4, ["inference.temperature=0.8"])
    assert list(arms) == ["async", "sync"]
    bench.check_arms(arms, 30)
    cfg = {name: load_config(None, [*DEMO_OVERRIDES, *o]) for name, o in arms.items()}
    for c in cfg.values():
        assert c.run.seed == 3 and c.algorithm.groups_per_step == 4 and c.inference.temperature == 0.8
    assert cfg["sync"].algorithm.max_staleness == 0 and not cfg["sync"].trainer.prefetch
    assert cfg["sync"].trainer.max_tasks_outstanding == 4
    assert cfg["async"].algorithm.max_staleness > 0 and cfg["async"].trainer.prefetch
    assert cfg["async"].trainer.max_tasks_outstanding == 12


def test_a_bad_override_stops_the_bench_before_any_arm_runs() -> None:
    bench = _bench()
    with pytest.raises(SystemExit, match="(?s)async arm.s config is invalid.*rollout.max_staleness: unknown key"):
        bench.check_arms(bench.arm_overrides(0, 4, ["rollout.max_staleness=0"]), 30)
