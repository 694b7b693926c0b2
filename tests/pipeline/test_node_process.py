"""``spoolrl rollout-node`` as a process: SIGKILL mid-run + restart finishes every task exactly
once; SIGTERM drains (in-flight tasks go back to the spool) and the process exits 0."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpc.config import load_config
from hpc.paths import RunPaths
from hpc.rundir import create_run
from hpc.spool import Spool
from hpc.trajectory import Status
from rollout_node.sandbox import bwrap_unavailable_reason
from rollout_node.tasks import load_tasks
from tests.proctree import deepest_first

pytestmark = pytest.mark.sandbox

CONFIG = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "model.path=/nonexistent",
          "spool.poll_interval_s=0.2", "spool.heartbeat_interval_s=1", "spool.lease_s=4", "spool.shard_max_age_s=1",
          "spool.shard_max_trajectories=2", "rollout.policy=scripted", "rollout.metrics_interval_s=1",
          "rollout.init_workers=1", "rollout.run_workers=2", "rollout.eval_workers=1", "algorithm.group_size=2"]


@pytest.fixture(autouse=True)
def _need_sandbox() -> None:
    if why := bwrap_unavailable_reason():
        pytest.skip(why)


def make_run(tmp_path: Path, n_tasks: int, *overrides: str) -> tuple[RunPaths, Any, list[str]]:
    cfg = load_config(None, [*CONFIG, f"sandbox.scratch_dir={tmp_path / 'scratch'}", *overrides])
    paths = create_run(tmp_path / "run", cfg)
    ids = [t.instance_id for t in load_tasks("builtin")][:n_tasks]
    Spool(paths.root, cfg.spool).put_tasks([{"task_id": i, "instance_id": i, "group_size": 2} for i in ids])
    return paths, cfg, ids


def start_node(paths: RunPaths, *args: str) -> subprocess.Popen[bytes]:
    log = open(paths.root / f"node-{time.monotonic_ns()}.out", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, "-m", "hpc.cli", "rollout-node", str(paths.root), "--node-id", "n1",
                             *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_sigkill_mid_run_then_restart_finishes_every_task_exactly_once(tmp_path: Path) -> None:
    paths, cfg, ids = make_run(tmp_path, 6, "rollout.scripted_plan=hang", "sandbox.command_timeout_s=10")
    spool = Spool(paths.root, cfg.spool)
    first = start_node(paths, "--once")
    wait_for(lambda: spool.stats()["tasks_done"] >= 1 and spool.stats()["tasks_claimed"] >= 1, 120,
             "a first finished task while others are in flight")
    os.killpg(first.pid, signal.SIGKILL)  # the node and its sandboxes die at once, as on a lost node
    first.wait()
    assert spool.stats()["tasks_done"] < len(ids), "the kill landed mid-run"
    second = start_node(paths, "--once")
    assert second.wait(timeout=240) == 0
    stats = spool.stats()
    assert (stats["tasks_ready"], stats["tasks_claimed"], stats["tasks_done"]) == (0, 0, len(ids))
    seen: dict[str, list[int]] = {}
    for shard in spool.claim_shards("test-trainer", 10_000):
        for t in shard.trajectories():
            assert (t.status, t.reward) == (Status.OK, 1.0)
            seen.setdefault(t.task_id, []).append(t.sample_index)
    assert {k: sorted(v) for k, v in seen.items()} == {i: [0, 1] for i in ids}, "every task once, whole groups"
    assert not any((tmp_path / "scratch").rglob("work/*")), "the restart removed the killed node's work dirs"


def test_sigterm_drains_and_releases_in_flight_tasks(tmp_path: Path) -> None:
    paths, cfg, ids = make_run(tmp_path, 4, "rollout.scripted_plan=slow", "rollout.drain_timeout_s=1",
                               "rollout.run_timeout_s=120")
    spool = Spool(paths.root, cfg.spool)
    node = start_node(paths)
    wait_for(lambda: spool.stats()["tasks_claimed"] >= 1 and any((tmp_path / "scratch").rglob("work/*")), 60,
             "an episode in RUN")
    node.send_signal(signal.SIGTERM)
    assert node.wait(timeout=60) == 0
    stats = spool.stats()
    assert (stats["tasks_ready"], stats["tasks_claimed"], stats["tasks_done"]) == (len(ids), 0, 0)
    assert stats["shards_ready"] == 0, "nothing of a released task was written"
    assert not any((tmp_path / "scratch").rglob("work/*")), "work dirs removed"
    ps = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert ps.stdout.strip() == "", "no sandbox process outlives the drained node"


def _signal_during_eval(tmp_path: Path, sig: signal.Signals) -> tuple[list[tuple[Status, float | None]], dict[str, int]]:
    """A node running gold patches gets ``sig`` deepest first (0.02 s apart: an EVAL's test runner
    hears it before the node) while an EVAL runs; returns what was written, and the spool's stats."""
    paths, cfg, ids = make_run(tmp_path, 2, "rollout.scripted_plan=gold")
    spool = Spool(paths.root, cfg.spool)
    node = start_node(paths)
    deadline = time.monotonic() + 120
    while not _runs_eval(node.pid):
        assert time.monotonic() < deadline and node.poll() is None, "no EVAL started"
        time.sleep(0.01)
    for pid in deepest_first(node.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        time.sleep(0.02)
    assert node.wait(timeout=90) == 0
    rewards = [(t.status, t.reward) for s in spool.claim_shards("test-trainer", 100) for t in s.trajectories()]
    stats = spool.stats()
    assert (stats["tasks_claimed"], stats["tasks_ready"] + stats["tasks_done"]) == (0, len(ids)), stats
    return rewards, stats


def _runs_eval(pid: int) -> bool:
    for p in deepest_first(pid):
        with contextlib.suppress(OSError):
            if b"\0-I\0-B\0-c\0" in Path(f"/proc/{p}/cmdline").read_bytes():  # the EVAL runner (harness)
                return True
    return False


def test_sigterm_to_the_tree_deepest_first_writes_no_interrupted_eval(tmp_path: Path) -> None:
    """Slurm's SIGTERM reaches an EVAL's test runner before the node: its gold patch must not be written
    as reward 0 (the agent's failure); the task goes back to the spool instead."""
    rewards, stats = _signal_during_eval(tmp_path, signal.SIGTERM)
    assert all(r == (Status.OK, 1.0) for r in rewards), f"an interrupted EVAL was written: {rewards}"
    assert stats["tasks_ready"] >= 1, "the task whose EVAL was interrupted went back to the spool"


def test_time_limit_warning_to_the_tree_deepest_first_lets_the_eval_finish(tmp_path: Path) -> None:
    """Slurm's time-limit warning (SIGUSR1) reaches an EVAL's test runner before the node: the runner
    ignores it, the node drains, and the group in flight is written with its real reward."""
    rewards, _ = _signal_during_eval(tmp_path, signal.SIGUSR1)
    assert rewards and all(r == (Status.OK, 1.0) for r in rewards), f"the drained EVAL was not scored: {rewards}"
