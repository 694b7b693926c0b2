"""Issue 14 item 6: stop in the right order, on a real ``spoolrl infer-node`` (CPU engine, tiny model)
and a real ``spoolrl rollout-node`` (LLM agent, bwrap sandboxes, EVAL harness).

- ``RUN/control/STOP`` reaches both at once: the inference node keeps serving while the rollout
  node's presence record exists, so the draining episodes are answered; nothing is written as
  ``inference_error``, and the inference node exits only after the rollout node did.
- The inference servers die under a draining rollout node: the episodes whose inference fails are
  released (back to the spool, no trajectory), not written as ``inference_error`` nor retried.

Both end with the exactly-once audit: every task written once as a whole group, or back in the spool.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hpc.cli.run import init_run
from hpc.config import load_config
from hpc.paths import RunPaths
from hpc.spool import Spool
from hpc.trajectory import Status
from rollout_node.sandbox import bwrap_unavailable_reason
from tests.pipeline.readback import written
from tests.pipeline.test_node_process import wait_for

pytestmark = pytest.mark.sandbox
IDS = ["spoolrl__intervals-1", "spoolrl__textkit-1", "spoolrl__intervals-2", "spoolrl__textkit-2"]
CONFIG = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "slurm.infer.gpus_per_node=0",
          "inference.engine=cpu", "inference.cpu_threads=1", "inference.heartbeat_s=0.3", "inference.max_retries=0",
          "spool.poll_interval_s=0.2", "spool.heartbeat_interval_s=1", "spool.shard_max_age_s=1",
          "rollout.policy=llm", "rollout.max_turns=40", "rollout.max_new_tokens_per_turn=16",
          "rollout.max_tokens=2048", "rollout.max_retries=1", "rollout.metrics_interval_s=1",
          "rollout.init_workers=1", "rollout.run_workers=2", "rollout.eval_workers=1", "algorithm.group_size=2"]


@pytest.fixture(autouse=True)
def _need_sandbox() -> None:
    if why := bwrap_unavailable_reason():
        pytest.skip(why)


def make_run(tmp_path: Path, *extra: str) -> tuple[RunPaths, Any]:
    cfg = load_config(None, [*CONFIG, f"sandbox.scratch_dir={tmp_path / 'scratch'}", *extra])
    paths = init_run(str(tmp_path / "run"), cfg)  # builds the tiny model into RUN/model
    Spool(paths.root, cfg.spool).put_tasks([{"task_id": i, "instance_id": i, "group_size": 2} for i in IDS])
    return paths, cfg


def start(paths: RunPaths, verb: str, *args: str) -> subprocess.Popen[bytes]:
    log = open(paths.root / f"{verb}.out", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, "-m", "hpc.cli", verb, str(paths.root), *args], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def start_both(paths: RunPaths, tmp_path: Path) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    infer = start(paths, "infer-node")
    wait_for(lambda: bool(list(paths.endpoints.glob("infer-*.json"))), 180, "an announced inference server")
    rollout = start(paths, "rollout-node", "--node-id", "n1")
    wait_for(lambda: any((tmp_path / "scratch").rglob("work/*")), 120, "an episode in flight")
    return infer, rollout


def audit(paths: RunPaths, cfg: Any) -> dict[str, list[Any]]:
    """Every task written once as a whole group or back in the spool; returns the written groups."""
    spool = Spool(paths.root, cfg.spool)
    assert spool.stats()["tasks_claimed"] == 0
    groups = written(paths, cfg)
    ready = []
    while (lease := spool.claim_task("auditor")) is not None:
        ready.append(str(lease.task_id))
    assert sorted([*groups, *ready]) == sorted(IDS), (sorted(groups), ready)
    for trajs in groups.values():
        assert sorted(t.sample_index for t in trajs) == [0, 1]
        assert all(t.status in (Status.OK, Status.TRUNCATED) for t in trajs), [t.status for t in trajs]
    return groups


def test_stop_marker_inference_serves_until_the_rollout_node_drained(tmp_path: Path) -> None:
    paths, cfg = make_run(tmp_path, "rollout.drain_timeout_s=30", "slurm.stop_grace_s=40")
    infer, rollout = start_both(paths, tmp_path)
    try:
        paths.stop_marker.write_text("test\n")
        assert rollout.wait(timeout=90) == 0
        rollout_done = time.monotonic()
        assert infer.wait(timeout=30) == 0
        assert time.monotonic() >= rollout_done
    finally:
        for proc in (infer, rollout):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    records = [json.loads(line) for f in paths.metrics.glob("infer-*.jsonl") for line in f.read_text().splitlines()]
    kinds = [r.get("kind") for r in records]
    assert "drain_wait" in kinds, kinds
    done = next(r for r in records if r.get("kind") == "drain_done")
    assert done["still_present"] == [], "the inference node stopped because the rollout node withdrew"
    assert not list(paths.endpoints.glob("*.json")), "presence record and endpoint files gone"
    groups = audit(paths, cfg)
    assert groups, "the draining episodes were answered and written"
    assert "inference_error" not in (paths.root / "rollout-node.out").read_text()


def _strays(run: Path) -> list[int]:
    """Processes whose command line names this run (the test's own process aside)."""
    found = []
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(run) in cmdline and int(proc_dir.name) != os.getpid() and state != "Z":
            found.append(int(proc_dir.name))
    return found


def _end_strays(run: Path) -> list[int]:
    """What of the run outlived its nodes after 30 s (killed, so that no test leaks a process). A server
    started just before its infer node was killed is in its own session: only its tether (servers.py)
    ends it."""
    deadline = time.monotonic() + 30
    while (left := _strays(run)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def test_inference_failure_while_draining_releases_the_task(tmp_path: Path) -> None:
    paths, cfg = make_run(tmp_path, "rollout.drain_timeout_s=45", "slurm.stop_grace_s=50")
    infer, rollout = start_both(paths, tmp_path)
    try:
        servers = [json.loads(f.read_text())["server_pid"] for f in paths.endpoints.glob("infer-*.json")]
        rollout.send_signal(signal.SIGUSR1)  # drain with a long deadline (a SIGTERM releases at once) ...
        log = paths.root / "rollout-node.out"
        # the node hears the signal in its main thread; an inference error a worker meets before that is an
        # ordinary fault (retried), so the servers die only once the drain is in effect
        wait_for(lambda: "draining (SIGUSR1)" in log.read_text(errors="replace"), 30, "the node draining")
        os.killpg(infer.pid, signal.SIGKILL)  # ... and the servers die under it (each in its own session)
        for pid in servers:
            os.kill(pid, signal.SIGKILL)
        infer.wait()
        assert rollout.wait(timeout=30) == 0, "released at the first failed request, not at the deadline"
    finally:
        for proc in (infer, rollout):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        strays = _end_strays(paths.root)
    assert not strays, f"processes outlived their nodes: {strays}"
    out = (paths.root / "rollout-node.out").read_text()
    assert "inference failed while draining" in out, out[-3000:]
    assert "inference_error (" not in out, "no fault row: released, not retried"
    groups = audit(paths, cfg)
    assert len(groups) < len(IDS)
