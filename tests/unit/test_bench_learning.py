"""``scripts/bench_learning.py``'s arms: each is a valid demo config that sets what its arm claims.

A wrong key in an arm used to surface only when that arm's demo started, after the first ~12-minute arm."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
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


def test_host_cpu_busy_is_the_busy_share_of_the_trainer_window() -> None:
    bench = _bench()
    samples = [{"t": 100.0, "busy": 0, "total": 0}, {"t": 110.0, "busy": 50, "total": 200},
               {"t": 120.0, "busy": 230, "total": 400}, {"t": 130.0, "busy": 430, "total": 600}]
    assert bench.host_cpu_busy(samples, 110.0, 120.0) == (230 - 50) / (400 - 200)
    assert bench.host_cpu_busy(samples, 100.0, 130.0) == 430 / 600
    assert bench.host_cpu_busy(samples, 140.0, 150.0) is None, "no sample inside the window"
    assert bench.host_cpu_busy(samples[:1], 100.0, 100.0) is None


def test_the_cpu_sampler_reads_this_hosts_proc_stat(tmp_path: Path) -> None:
    bench = _bench()
    log = tmp_path / "arm.cpu.jsonl"
    deadline = time.monotonic() + 1.2
    with bench.sample_cpu(log):
        while time.monotonic() < deadline:  # keep one core busy: the share cannot read 0
            pass
    samples = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(samples) >= 3 and all(a["total"] <= b["total"] for a, b in zip(samples, samples[1:], strict=False))
    busy = bench.host_cpu_busy(samples, samples[0]["t"], samples[-1]["t"])
    assert busy is not None and 1 / (os.cpu_count() or 1) * 0.5 < busy <= 1.0, busy
    assert bench.cpu_log_of(tmp_path / "async") == tmp_path / "async.cpu.jsonl"
