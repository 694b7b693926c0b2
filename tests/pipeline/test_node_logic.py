"""The node's logic with the real spool and local stand-ins for tasks and sandboxes (fast).

Groups, retries per the fault table, cancellation, staleness, drain and exactly-once writing.
The same behaviours are exercised with real sandboxes and the real harness in test_node_real.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from hpc.config import load_config
from hpc.paths import RunPaths
from hpc.records import TrainerWaiting, write_trainer_waiting
from hpc.rundir import create_run
from hpc.spool import Spool
from hpc.trajectory import Status
from rollout_node.pipeline.control import request_cancel
from rollout_node.pipeline.node import NodeOptions, RolloutNode
from rollout_node.pipeline.scripted import ScriptedPolicy
from rollout_node.pipeline.sizing import Workers
from tests.pipeline.readback import written
from tests.pipeline.standins import FakeOps

BASE = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "model.path=/nonexistent",
        "spool.poll_interval_s=0.05", "spool.heartbeat_interval_s=0.5", "spool.lease_s=5",
        "spool.shard_max_age_s=0.5", "rollout.policy=scripted", "rollout.max_retries=1",
        "rollout.metrics_interval_s=0.5", "algorithm.group_size=2"]


def make_run(tmp_path: Path, *overrides: str) -> tuple[RunPaths, Any]:
    cfg = load_config(None, [*BASE, *overrides])
    return create_run(tmp_path / "run", cfg), cfg


def node(paths: RunPaths, cfg: Any, ops: FakeOps, tmp_path: Path, **kw: Any) -> RolloutNode:
    opts = NodeOptions(node_id="n0", workers=Workers(init=1, run=3, eval=1), scratch=tmp_path / "scratch",
                       once=kw.pop("once", True), max_episodes=kw.pop("max_episodes", None))
    return RolloutNode(paths, cfg, Spool(paths.root, cfg.spool), ops,  # type: ignore[arg-type]  # FakeOps: a partial stand-in
                       ScriptedPolicy(cfg.rollout.scripted_plan), opts, **kw)


def tasks(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"task_id": f"t{i}", **extra} for i in range(n)]


def test_every_task_ends_with_one_group_and_nothing_stays_claimed(tmp_path: Path) -> None:
    paths, cfg = make_run(tmp_path, "rollout.scripted_plan=t0=empty;*=gold")
    Spool(paths.root, cfg.spool).put_tasks(tasks(5))
    ops = FakeOps()
    summary = node(paths, cfg, ops, tmp_path).run()
    groups = written(paths, cfg)
    assert sorted(groups) == [f"t{i}" for i in range(5)]
    for task_id, trajs in groups.items():
        assert sorted(t.sample_index for t in trajs) == [0, 1]
        assert len({t.group_id for t in trajs}) == 1
        assert all(t.status == Status.OK for t in trajs)
        assert all(t.reward == (0.0 if task_id == "t0" else 1.0) for t in trajs)
        assert all(t.num_generated > 0 and t.prompt_len > 0 for t in trajs)
    stats = Spool(paths.root, cfg.spool).stats()
    assert stats["tasks_claimed"] == 0 and stats["tasks_ready"] == 0 and stats["tasks_done"] == 5
    assert summary["groups_written"] == 5
    assert ops.max_open <= 3, "live sandboxes never exceed the RUN workers"
    assert not list((tmp_path / "scratch").rglob("bug.txt")), "work dirs are removed"
    seeds = {(t.task_id, t.sample_index): t.sampling["seed"] for g in groups.values() for t in g}
    assert len(set(seeds.values())) == len(seeds), "each sample has its own seed"


def test_fault_rows_retry_then_final_status(tmp_path: Path) -> None:
    plan = "crash=crash;crash_once=crash|gold;infer=inference_error;hang=hang;*=gold"
    paths, cfg = make_run(tmp_path, f"rollout.scripted_plan={plan}", "algorithm.group_size=1", "algorithm.drop_zero_variance=false",
                          "sandbox.command_timeout_s=1")
    names = ["crash", "crash_once", "infer", "hang", "harness", "harness_once", "initfail", "badimage", "bad"]
    specs: list[dict[str, Any]] = [{"task_id": n} for n in names[:-2]] + [{"task_id": "badimage", "image": "missing-image"},
                                                    {"task_id": "bad", "broken": True}]
    Spool(paths.root, cfg.spool).put_tasks(specs)
    ops = FakeOps(fail_prepare={"initfail"}, harness_errors={"harness": 5, "harness_once": 1})
    node(paths, cfg, ops, tmp_path).run()
    got = {k: v[0] for k, v in written(paths, cfg).items()}
    assert set(got) == set(names)
    expect = {"crash": (Status.SANDBOX_ERROR, None, 1), "crash_once": (Status.OK, 1.0, 1),
              "infer": (Status.INFERENCE_ERROR, None, 1), "hang": (Status.OK, 1.0, 0),
              "harness": (Status.HARNESS_ERROR, None, 0), "harness_once": (Status.OK, 1.0, 0),
              "initfail": (Status.SANDBOX_ERROR, None, 1), "badimage": (Status.SANDBOX_ERROR, None, 1),
              "bad": (Status.NODE_ERROR, None, 0)}
    for name, (status, reward, attempt) in expect.items():
        t = got[name]
        assert (t.status, t.reward, t.metrics["sample_attempt"]) == (status, reward, attempt), name
        assert t.trainable == status.trainable
    assert ops.evaluated.count("harness") == 2, "a harness error reruns EVAL only, max_retries times"
    assert Spool(paths.root, cfg.spool).stats()["tasks_claimed"] == 0


def test_run_timeout_is_trainable_and_scored(tmp_path: Path) -> None:
    paths, cfg = make_run(tmp_path, "rollout.scripted_plan=slow", "rollout.run_timeout_s=1",
                          "algorithm.group_size=1", "algorithm.drop_zero_variance=false")
    Spool(paths.root, cfg.spool).put_tasks(tasks(1))
    node(paths, cfg, FakeOps(), tmp_path).run()
    (t,) = written(paths, cfg)["t0"]
    assert t.status == Status.TIMEOUT and t.reward == 0.0 and t.trainable


def test_cancel_by_task_writes_cancelled_group_and_closes_sandboxes(tmp_path: Path) -> None:
    paths, cfg = make_run(tmp_path, "rollout.scripted_plan=victim=slow;*=gold")
    Spool(paths.root, cfg.spool).put_tasks([{"task_id": "victim"}, {"task_id": "other"}])
    ops = FakeOps()
    n = node(paths, cfg, ops, tmp_path)
    threading.Timer(1.0, lambda: request_cancel(paths, "victim")).start()
    n.run()
    groups = written(paths, cfg)
    assert [t.status for t in groups["victim"]] == [Status.CANCELLED] * 2
    assert all(t.reward is None for t in groups["victim"])
    assert [t.reward for t in groups["other"]] == [1.0, 1.0]
    assert ops.open_sandboxes == 0


def test_stale_episodes_are_restarted_then_cancelled(tmp_path: Path) -> None:
    paths, cfg = make_run(tmp_path, "rollout.scripted_plan=slow", "algorithm.max_staleness=1",
                          "algorithm.group_size=1", "algorithm.drop_zero_variance=false", "rollout.run_timeout_s=30")
    Spool(paths.root, cfg.spool).put_tasks(tasks(1))

    def bump() -> None:
        for v in range(1, 40):
            paths.policy_latest.write_text(f"{v}\n")
            time.sleep(0.3)

    threading.Thread(target=bump, daemon=True).start()
    node(paths, cfg, FakeOps(), tmp_path).run()
    (t,) = written(paths, cfg)["t0"]
    assert t.status == Status.CANCELLED and t.metrics["sample_attempt"] == 1 and t.reward is None


def test_drain_releases_in_flight_tasks(tmp_path: Path) -> None:
    paths, cfg = make_run(tmp_path, "rollout.scripted_plan=slow", "rollout.drain_timeout_s=0.5")
    spool = Spool(paths.root, cfg.spool)
    spool.put_tasks(tasks(4))
    ops = FakeOps()
    n = node(paths, cfg, ops, tmp_path, once=False)
    threading.Timer(1.5, lambda: n.request_drain("SIGTERM")).start()
    summary = n.run()
    stats = spool.stats()
    assert stats["tasks_claimed"] == 0 and stats["tasks_done"] == 0 and stats["tasks_ready"] == 4
    assert summary["groups_released"] >= 1
    assert written(paths, cfg) == {}
    assert ops.open_sandboxes == 0


def test_backpressure_stops_claims(tmp_path: Path) -> None:
    paths, cfg = make_run(tmp_path, "spool.max_ready_shards=2", "spool.shard_max_trajectories=1",
                          "rollout.queue_size=1", "rollout.claim_lookahead=1")
    spool = Spool(paths.root, cfg.spool)
    n_tasks = 16
    spool.put_tasks(tasks(n_tasks))
    n = node(paths, cfg, FakeOps(), tmp_path, once=False)
    threading.Timer(3.0, lambda: n.request_drain("test")).start()
    summary = n.run()
    stats = spool.stats()
    assert summary["not_claiming"] == "backpressure"
    # The first group written publishes 2 shards (one trajectory each), which is the limit. Before it
    # lands, however slow the machine, the node holds at most: its backlog (claim_lookahead), the
    # group the feeder is queueing, one group per episode slot in the stages (queues 3 x 1, workers
    # init 1 + run 3 + eval 1: 8 slots; a group whose other episode finished still holds its claim),
    # and one claim while the cached pending count (at most poll_interval_s old) reads below the
    # limit. Nothing is claimed after, so the rest of the 16 stay ready.
    most_claimed = cfg.rollout.claim_lookahead + 1 + (3 * cfg.rollout.queue_size + 1 + 3 + 1) + 1
    assert 1 <= stats["tasks_done"] <= most_claimed
    assert stats["tasks_done"] + stats["tasks_ready"] == n_tasks
    assert stats["tasks_claimed"] == 0


def _wait_for(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_an_open_shard_is_sealed_when_the_trainer_waits_and_not_before(tmp_path: Path) -> None:
    """The shard's age limit (600 s) is out of reach and the node is never idle (a slow task stays in RUN), so
    only control/TRAINER_WAITING can seal the finished group's shard: not while it is absent, within one poll of
    the node once it appears; a group written while it stands is sealed at once."""
    paths, cfg = make_run(tmp_path, "rollout.scripted_plan=busy*=slow;*=gold", "algorithm.group_size=1",
                          "algorithm.drop_zero_variance=false",
                          "spool.shard_max_age_s=600", "rollout.run_timeout_s=600", "rollout.drain_timeout_s=0.5")
    spool = Spool(paths.root, cfg.spool)
    spool.put_tasks([{"task_id": "busy"}, {"task_id": "t0"}])
    n = node(paths, cfg, FakeOps(), tmp_path, once=False)
    thread = threading.Thread(target=n.run, daemon=True)
    thread.start()
    try:
        _wait_for(lambda: n.outcomes.sink is not None and n.outcomes.sink.writer.pending() == 1,
                  "the gold group reaches the open shard")
        polls = n.control.poll_s + 0.2  # the control loop's refresh interval, plus its tick
        time.sleep(5 * polls)
        assert spool.pending_work() == 0 and spool.task_counts()["tasks_done"] == 0, "sealed without the signal"
        write_trainer_waiting(paths, TrainerWaiting(step=1, policy_version=0, generation=1, since=time.time()))
        _wait_for(lambda: spool.pending_work() == 1, "the open shard is sealed once the trainer waits")
        _wait_for(lambda: spool.task_counts()["tasks_done"] == 1, "its task is finished once its shard is published")
        spool.put_tasks([{"task_id": "t1"}])  # written while the marker stands: its own shard, at once
        _wait_for(lambda: spool.pending_work() == 2, "a group written while the trainer waits is sealed at once")
    finally:
        n.request_drain("test")
        thread.join(timeout=30)
    assert sorted(written(paths, cfg)) == ["t0", "t1"], "each group once, the slow one released"
    stats = spool.stats()
    assert stats["tasks_done"] == 2 and stats["tasks_ready"] == 1 and stats["tasks_claimed"] == 0


def test_max_episodes_exits_after_whole_groups(tmp_path: Path) -> None:
    paths, cfg = make_run(tmp_path, "rollout.claim_lookahead=1", "rollout.queue_size=2")
    spool = Spool(paths.root, cfg.spool)
    spool.put_tasks(tasks(5))
    summary = node(paths, cfg, FakeOps(), tmp_path, once=False, max_episodes=4).run()
    assert summary["groups_written"] == 2 and summary["episodes"] == 4
    assert spool.stats()["tasks_done"] == 2 and spool.stats()["tasks_claimed"] == 0


def test_claims_prefer_tasks_whose_image_is_cached(tmp_path: Path) -> None:
    paths, cfg = make_run(tmp_path, "rollout.claim_lookahead=8", "rollout.queue_size=1")
    # The spool hands out ready tasks in random order: without the preference "warm" would come
    # first only 1 time in 8.
    Spool(paths.root, cfg.spool).put_tasks([{"task_id": f"cold{i}", "image": "cold"} for i in range(7)]
                                           + [{"task_id": "warm", "image": "warm"}])
    ops = FakeOps(cached={"warm"})
    node(paths, cfg, ops, tmp_path).run()
    assert ops.prepared[0] == "warm", ops.prepared
    assert len(ops.prepared) == 16


class ShortJob:
    """A job clock that says the Slurm time limit is 10 s away."""

    def remaining_s(self) -> float:
        return 10.0


def test_no_claims_when_the_job_ends_before_an_episode_could(tmp_path: Path) -> None:
    paths, cfg = make_run(tmp_path, "rollout.time_limit_margin_s=30")
    spool = Spool(paths.root, cfg.spool)
    spool.put_tasks(tasks(2))
    n = node(paths, cfg, FakeOps(), tmp_path, once=False, job_clock=ShortJob())
    threading.Timer(1.5, lambda: n.request_drain("test")).start()
    summary = n.run()
    assert summary["not_claiming"] == "time_limit"
    assert spool.stats()["tasks_ready"] == 2 and summary["claimed_samples"] == 0


def test_worker_counts_default_from_the_node_and_config_wins(tmp_path: Path) -> None:
    from rollout_node.pipeline.sizing import default_workers

    cfg = load_config(None, BASE)
    auto = default_workers(cfg.rollout, cfg.sandbox, tmp_path)
    assert auto.init >= 1 and auto.run >= 1 and auto.eval >= 1
    tight = load_config(None, [*BASE, "rollout.scratch_per_episode_gb=1000000"])
    capped = default_workers(tight.rollout, tight.sandbox, tmp_path)
    assert (capped.init, capped.run, capped.eval) == (1, 1, 1), "free scratch caps every stage"
    fixed = load_config(None, [*BASE, "rollout.init_workers=3", "rollout.run_workers=17", "rollout.eval_workers=5"])
    assert default_workers(fixed.rollout, fixed.sandbox, tmp_path) == Workers(3, 17, 5)


def test_sampling_seeds_are_a_function_of_run_task_sample_attempt() -> None:
    from rollout_node.pipeline.seeds import episode_seed

    seed = episode_seed(7, "task-a", 1, 0)
    assert seed == episode_seed(7, "task-a", 1, 0)
    others = {episode_seed(8, "task-a", 1, 0), episode_seed(7, "task-b", 1, 0), episode_seed(7, "task-a", 2, 0),
              episode_seed(7, "task-a", 1, 1)}
    assert seed not in others and len(others) == 4


def test_an_early_seal_that_fails_keeps_the_group_pending_and_its_task_open(tmp_path: Path) -> None:
    """A full disk when the trainer's wait seals a shard early: logged, the group stays in the open shard and its
    task unfinished (its lease covers it); the next seal publishes it and then finishes the task."""
    from types import SimpleNamespace

    from hpc.errors import SpoolError
    from rollout_node.pipeline.sink import GroupSink
    from tests.spool.spool_helpers import make_traj

    paths, cfg = make_run(tmp_path, "spool.shard_max_age_s=600")
    spool = Spool(paths.root, cfg.spool)
    spool.put_tasks(tasks(1))
    lease = spool.claim_task("w0")
    assert lease is not None
    sink = GroupSink(spool, "w0", seal_now=lambda: True)
    publish = sink.writer._publish

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise SpoolError("disk full (test)")

    sink.writer._publish = disk_full  # type: ignore[method-assign]
    group = SimpleNamespace(task_id="t0", claim=SimpleNamespace(lease=lease))
    assert sink.write(group, [make_traj("t0", 0), make_traj("t0", 1)])  # type: ignore[arg-type]
    assert sink.writer.pending() == 2 and sink.awaiting and spool.pending_work() == 0
    assert spool.task_counts()["tasks_done"] == 0, "a task is finished only once its shard is published"
    sink.writer._publish = publish  # type: ignore[method-assign]
    sink.flush()
    assert sink.writer.pending() == 0 and not sink.awaiting and spool.pending_work() == 1
    assert spool.task_counts()["tasks_done"] == 1
    sink.close()
    assert sorted(t.sample_index for t in written(paths, cfg)["t0"]) == [0, 1]
