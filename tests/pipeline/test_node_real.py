"""The rollout node end to end on real parts: the spool, bwrap sandboxes, the built-in tasks and
the real EVAL harness, driven by the scripted policy (gold replay, empty, tampering, faults).

Slow-ish (real test runs in EVAL): the node runs in-process here; test_node_process.py runs the
``spoolrl rollout-node`` process (SIGKILL + restart, SIGTERM drain).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hpc.config import load_config
from hpc.paths import RunPaths
from hpc.rundir import create_run
from hpc.spool import Spool
from hpc.trajectory import Status
from rollout_node.pipeline.bindings import RealTaskOps
from rollout_node.pipeline.control import request_cancel
from rollout_node.pipeline.node import NodeOptions, RolloutNode
from rollout_node.pipeline.scripted import ScriptedPolicy
from rollout_node.pipeline.sizing import Workers
from rollout_node.sandbox import bwrap_unavailable_reason
from rollout_node.tasks import load_tasks
from tests.pipeline.readback import written

pytestmark = pytest.mark.sandbox

CONFIG = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "model.path=/nonexistent",
          "spool.poll_interval_s=0.1", "spool.heartbeat_interval_s=1", "spool.lease_s=30",
          "spool.shard_max_age_s=1", "rollout.policy=scripted", "rollout.max_retries=1",
          "rollout.metrics_interval_s=1", "sandbox.command_timeout_s=20"]


@pytest.fixture(autouse=True)
def _need_sandbox() -> None:
    if why := bwrap_unavailable_reason():
        pytest.skip(why)


def make_run(tmp_path: Path, *overrides: str) -> tuple[RunPaths, Any]:
    cfg = load_config(None, [*CONFIG, f"sandbox.scratch_dir={tmp_path / 'scratch'}", *overrides])
    return create_run(tmp_path / "run", cfg), cfg


def run_node(paths: RunPaths, cfg: Any, tmp_path: Path, workers: Workers = Workers(1, 3, 2)) -> dict[str, Any]:
    opts = NodeOptions(node_id="n0", workers=workers, scratch=tmp_path / "node", once=True)
    node = RolloutNode(paths, cfg, Spool(paths.root, cfg.spool), RealTaskOps(paths, cfg),
                       ScriptedPolicy(cfg.rollout.scripted_plan), opts)
    return node.run()


def by_reference(ids: list[str], group_size: int) -> list[dict[str, Any]]:
    """Tasks as the trainer's feeder puts them: a reference to an instance of tasks.source."""
    return [{"task_id": f"{iid}@e0", "instance_id": iid, "epoch": 0, "group_size": group_size,
             "policy_version": 0} for iid in ids]


def test_builtin_tasks_gold_and_empty_through_the_whole_pipeline(tmp_path: Path) -> None:
    ids = [t.instance_id for t in load_tasks("builtin")]
    empty = set(ids[::3])
    plan = ";".join(f"{iid}@e0=empty" for iid in sorted(empty)) + ";*=gold"
    paths, cfg = make_run(tmp_path, f"rollout.scripted_plan={plan}", "algorithm.group_size=2")
    Spool(paths.root, cfg.spool).put_tasks(by_reference(ids, 2))
    summary = run_node(paths, cfg, tmp_path)
    groups = written(paths, cfg)
    assert sorted(groups) == sorted(f"{i}@e0" for i in ids), "every task ends with a trajectory group"
    for task_id, trajs in groups.items():
        expected = 0.0 if task_id.removesuffix("@e0") in empty else 1.0
        assert sorted(t.sample_index for t in trajs) == [0, 1]
        assert [(t.status, t.reward) for t in trajs] == [(Status.OK, expected)] * 2, task_id
        assert all(t.trainable and t.num_generated > 0 for t in trajs)
        assert all(t.metrics["eval_status"] == "ok" for t in trajs)
    stats = Spool(paths.root, cfg.spool).stats()
    assert (stats["tasks_ready"], stats["tasks_claimed"], stats["tasks_done"]) == (0, 0, len(ids))
    assert summary["groups_written"] == len(ids) and summary["statuses"] == {"ok": 2 * len(ids)}
    leftovers = [p for p in (tmp_path / "node").rglob("*") if p.is_file()]
    assert leftovers == [], "work dirs and eval trees are removed"


@pytest.mark.parametrize("tamper", ["tamper_test", "tamper_conftest", "tamper_pth"])
def test_tampering_agents_score_zero(tmp_path: Path, tamper: str) -> None:
    ids = ["spoolrl__intervals-1", "spoolrl__textkit-2", "spoolrl__tinyformats-3"]
    paths, cfg = make_run(tmp_path, f"rollout.scripted_plan={tamper}", "algorithm.group_size=1",
                          "algorithm.drop_zero_variance=false")
    Spool(paths.root, cfg.spool).put_tasks(by_reference(ids, 1))
    run_node(paths, cfg, tmp_path)
    groups = written(paths, cfg)
    assert len(groups) == len(ids)
    for task_id, (t,) in groups.items():
        assert (t.status, t.reward) == (Status.OK, 0.0), f"{tamper} on {task_id} must not be rewarded"
        assert t.metrics["diff_bytes"] > 0, "the tampering really changed the work dir"


@pytest.mark.parametrize("dedup", [True, False])
def test_a_group_evaluates_each_distinct_diff_once(tmp_path: Path, dedup: bool) -> None:
    """rollout.eval_dedup: the samples of a group that end with the same diff share one real EVAL (the fix
    and the tampering alike), each group runs its own; off, every sample runs the tests."""
    fix, cheat = "spoolrl__intervals-1", "spoolrl__textkit-2"
    paths, cfg = make_run(tmp_path, f"rollout.scripted_plan={cheat}@e0=tamper_test;*=gold", "algorithm.group_size=3",
                          "algorithm.drop_zero_variance=false", f"rollout.eval_dedup={str(dedup).lower()}")
    Spool(paths.root, cfg.spool).put_tasks(by_reference([fix, cheat], 3))
    run_node(paths, cfg, tmp_path)
    groups = written(paths, cfg)
    for iid, reward in ((fix, 1.0), (cheat, 0.0)):
        trajs = groups[f"{iid}@e0"]
        assert [(t.status, t.reward) for t in trajs] == [(Status.OK, reward)] * 3, iid
        assert len({t.metrics["diff"] for t in trajs}) == 1, "the scripted samples of a group write one diff"
        shared = sorted(bool(t.metrics["eval_shared"]) for t in trajs)
        assert shared == ([False, True, True] if dedup else [False] * 3), iid
        assert all(t.metrics["eval_status"] == "ok" for t in trajs)


def test_fault_table_rows_on_real_sandboxes_and_harness(tmp_path: Path) -> None:
    """Each row injected for real: the sandbox killed under the agent, a sandbox that cannot start,
    a hung tool, an episode past run_timeout_s, a harness that fails, an inference failure."""
    base = load_tasks("builtin")[0]
    # A task whose test patch cannot apply: the harness cannot score it (not the agent's fault).
    broken = {**base.to_dict(), "task_id": "harness",
              "test_patch": "--- a/no_such_file.py\n+++ b/no_such_file.py\n@@ -1 +1 @@\n-x\n+y\n"}
    no_image = {**base.to_dict(), "task_id": "no_image", "image": str(tmp_path / "no-such-image")}
    plan = "crash=crash;crash_once=crash|gold;hang=hang;slow=slow;infer=inference_error;*=gold"
    paths, cfg = make_run(tmp_path, f"rollout.scripted_plan={plan}", "algorithm.group_size=1",
                          "algorithm.drop_zero_variance=false", "rollout.run_timeout_s=8")
    refs = [{"task_id": name, "instance_id": base.instance_id, "group_size": 1}
            for name in ("crash", "crash_once", "hang", "slow", "infer")]
    Spool(paths.root, cfg.spool).put_tasks([*refs, broken, no_image])
    run_node(paths, cfg, tmp_path, Workers(2, 4, 2))
    got = {task_id: trajs[0] for task_id, trajs in written(paths, cfg).items()}
    expect = {  # task: (status, reward, sample attempt) - see rollout_node/pipeline/faults.py
        "crash": (Status.SANDBOX_ERROR, None, 1), "crash_once": (Status.OK, 1.0, 1),
        "no_image": (Status.SANDBOX_ERROR, None, 1), "hang": (Status.OK, 1.0, 0),
        "slow": (Status.TIMEOUT, 0.0, 0), "harness": (Status.HARNESS_ERROR, None, 0),
        "infer": (Status.INFERENCE_ERROR, None, 1),
    }
    assert {k: (t.status, t.reward, t.metrics["sample_attempt"]) for k, t in got.items()} == expect
    assert got["harness"].metrics["eval_tries"] == 2, "a harness error reruns EVAL (same diff) max_retries times"
    assert [t.trainable for t in got.values()] == [s.trainable for s, _, _ in (expect[k] for k in got)]
    assert Spool(paths.root, cfg.spool).stats()["tasks_claimed"] == 0


def _sandbox_processes(under: Path) -> list[str]:
    """Command lines of live processes started for a sandbox under ``under`` (bwrap argv names it)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(under) in cmd and "pytest" not in cmd:
            found.append(cmd[:200])
    return found


def test_cancel_by_task_on_real_sandboxes(tmp_path: Path) -> None:
    """A cancel marker stops a running episode in its real bwrap sandbox: the group is written as
    cancelled (excluded from training), the other task scores, and no sandbox process is left."""
    iid = load_tasks("builtin")[0].instance_id
    paths, cfg = make_run(tmp_path, "rollout.scripted_plan=victim@e0=slow;*=gold", "algorithm.group_size=2",
                          "algorithm.drop_zero_variance=false", "rollout.run_timeout_s=60")
    refs = [{**ref, "task_id": name} for ref, name in zip(by_reference([iid, iid], 2), ("victim@e0", "other@e0"),
                                                           strict=True)]
    Spool(paths.root, cfg.spool).put_tasks(refs)
    threading.Timer(3.0, lambda: request_cancel(paths, "victim@e0")).start()
    t0 = time.monotonic()
    run_node(paths, cfg, tmp_path)
    assert time.monotonic() - t0 < 45, "the cancelled episode ran on instead of stopping"
    groups = written(paths, cfg)
    assert [t.status for t in groups["victim@e0"]] == [Status.CANCELLED] * 2
    assert all(t.reward is None and not t.trainable for t in groups["victim@e0"])
    assert [t.reward for t in groups["other@e0"]] == [1.0, 1.0]
    assert _sandbox_processes(tmp_path) == []
    assert Spool(paths.root, cfg.spool).stats()["tasks_claimed"] == 0


def test_stale_episode_on_real_sandboxes_is_restarted_then_cancelled(tmp_path: Path) -> None:
    """The policy moves on while an episode runs in a real sandbox: past max_staleness it is restarted
    once (a fresh sandbox), then cancelled; nothing of either sandbox survives."""
    iid = load_tasks("builtin")[0].instance_id
    paths, cfg = make_run(tmp_path, "rollout.scripted_plan=slow", "algorithm.max_staleness=1",
                          "algorithm.group_size=1", "algorithm.drop_zero_variance=false", "rollout.run_timeout_s=60")
    Spool(paths.root, cfg.spool).put_tasks(by_reference([iid], 1))
    stop = threading.Event()

    def bump() -> None:
        for v in range(1, 200):
            if stop.wait(0.3):
                return
            paths.policy_latest.write_text(f"{v}\n")

    threading.Thread(target=bump, daemon=True).start()
    try:
        run_node(paths, cfg, tmp_path)
    finally:
        stop.set()
    (t,) = written(paths, cfg)[f"{iid}@e0"]
    assert t.status == Status.CANCELLED and t.reward is None
    assert t.metrics["sample_attempt"] == 1, "restarted once before being cancelled"
    assert _sandbox_processes(tmp_path) == []
