"""Issue 14 item 7: a failing rollout node stops itself.

Real ``spoolrl rollout-node`` processes on real bwrap sandboxes: every episode's sandbox is killed
under the agent (scripted ``crash``, a real :class:`~hpc.errors.SandboxError`), so after
``rollout.max_consecutive_infra_faults`` faults in a row the node stops claiming, releases what it
holds and exits 3 naming the reason; the audit then finds every task back in the spool once, nothing
written, its scratch and its presence record gone.
"""

from __future__ import annotations

from pathlib import Path

from hpc.spool import Spool
from hpc.trajectory import Status
from rollout_node.pipeline.faults import Fault
from rollout_node.pipeline.health import InfraStreak
from tests.pipeline.test_node_process import make_run, start_node


def test_streak_counts_infrastructure_faults_in_a_row_and_resets_on_any_other_outcome() -> None:
    streak = InfraStreak(3)
    assert streak.fault(Fault.SANDBOX_CRASH, "a") == "" and streak.fault(Fault.INFERENCE_ERROR, "b") == ""
    streak.outcome(Status.OK)  # a trainable sample in between: the node works
    assert streak.fault(Fault.HARNESS_ERROR, "c") == "" and streak.fault(Fault.STALE, "not infra") == ""
    assert streak.fault(Fault.PIPELINE_BUG, "d") == ""
    streak.outcome(Status.SANDBOX_ERROR)  # a final infrastructure status is no reset
    reason = streak.fault(Fault.INIT_FAILURE, "disk full")
    assert "3 consecutive infrastructure faults" in reason and "init_failure: disk full" in reason
    assert streak.fault(Fault.INIT_FAILURE, "again") == "", "the reason is returned once"
    assert InfraStreak(0).fault(Fault.SANDBOX_CRASH, "x") == "", "0 turns the check off"


def test_node_stops_itself_after_consecutive_sandbox_crashes_and_releases_its_tasks(tmp_path: Path) -> None:
    paths, cfg, ids = make_run(tmp_path, 4, "rollout.scripted_plan=crash", "rollout.max_retries=5",
                               "rollout.max_consecutive_infra_faults=3")
    spool = Spool(paths.root, cfg.spool)
    node = start_node(paths)  # no --once: without the check it would crash-loop for good
    assert node.wait(timeout=120) == 3
    out = next(paths.root.glob("node-*.out")).read_text()
    assert "stopped itself: 3 consecutive infrastructure faults" in out and "sandbox_crash" in out, out[-3000:]
    stats = spool.stats()
    assert (stats["tasks_ready"], stats["tasks_claimed"], stats["tasks_done"]) == (len(ids), 0, 0)
    assert stats["shards_ready"] == 0, "a failing node writes nothing: its tasks go back whole"
    assert not list(paths.endpoints.glob("rollout-node-*.json")), "presence record withdrawn"
    assert not any((tmp_path / "scratch").rglob("work/*")), "scratch removed"
    # exactly-once audit: each task is back in the spool once, whole (a new claimer gets each id once)
    claimed = []
    while (lease := spool.claim_task("auditor")) is not None:
        claimed.append(str(lease.task_id))
    assert sorted(claimed) == sorted(ids)
