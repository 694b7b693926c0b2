"""The soak's end-of-run checks (``scripts/chaos/audit.py``) fail on what they exist to catch.

The 3-minute soak (tests/e2e/test_soak.py) shows they pass on a real run; here each check is fed
what a broken run would leave (a task trained twice, a task lost, a ``/process`` call answered twice
or never, a connection dropped by a server that lived on, a reload past its bound, a long trainer wait,
a role outliving the trainer or needing the SIGKILL after the whole-run stop's grace, a leaked sandbox
process, an infrastructure failure in the loss, a role never killed, no whole-run resume) and must fail,
next to a clean case that passes. The kill and restart logic runs on a harness whose roles are ``sleep``
processes.
"""

from __future__ import annotations

import random
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpc.records import EndpointRecord, write_endpoint
from hpc.trajectory import Status
from scripts.chaos import audit
from scripts.chaos import client as chaos_client
from scripts.chaos.harness import ROLES, Harness
from scripts.chaos.procs import now
from scripts.chaos.scheduler import Chaos, fault_plan, finish_chaos, kill_plan


def row(task: str, traj: str, step: int, outcome: str = "trained", reason: str = "") -> dict[str, Any]:
    return {"task_id": task, "trajectory_id": traj, "step": step, "outcome": outcome,
            **({"reason": reason} if reason else {})}


CLEAN_LEDGER = [row("t1", "t1:0:0", 1), row("t1", "t1:1:0", 1), row("t2", "t2:0:0", 2),
                row("t3", "t3:0:0", 2, "dropped", "sandbox_error")]


def test_tasks_clean_run_passes() -> None:
    issued = {"t1": "done", "t2": "done", "t3": "done", "t4": "ready", "t5": "claimed"}
    check = audit.check_tasks(issued, CLEAN_LEDGER, unconsumed={"t5"}, spool_drops={})
    assert check.ok, check.detail
    assert check.detail["fates"] == {"trained": 2, "dropped:sandbox_error": 1, "queued": 1, "in_ready_shard": 1}


@pytest.mark.parametrize(("ledger", "issued", "key"), [
    ([*CLEAN_LEDGER, row("t2", "t2:0:0b", 5)], {"t1": "done", "t2": "done"}, "trained_twice"),
    ([*CLEAN_LEDGER, row("t2", "t2:0:0", 2)], {"t1": "done", "t2": "done"}, "ledger_rows_twice"),
    (CLEAN_LEDGER, {"t1": "done", "t9": "done"}, "lost"),
    (CLEAN_LEDGER, {"t1": "done", "t9": "claimed"}, "lost"),
])
def test_tasks_duplicated_or_lost_fails(ledger: list[dict[str, Any]], issued: dict[str, str], key: str) -> None:
    check = audit.check_tasks(issued, ledger, unconsumed=set(), spool_drops={})
    assert not check.ok and check.detail[key], check.detail


def test_a_task_requeued_from_a_killed_holder_is_accounted_for() -> None:
    issued = {"t1": "done", "t2": "done", "t3": "done", "t6": "ready"}
    check = audit.check_tasks(issued, CLEAN_LEDGER, set(), {}, requeued=frozenset({"t6"}))
    assert check.ok and check.detail["fates"]["requeued:holder_killed"] == 1, check.detail
    held = audit.check_tasks({**issued, "t6": "claimed"}, CLEAN_LEDGER, set(), {}, requeued=frozenset({"t6"}))
    assert not held.ok and held.detail["lost"] == ["t6 (claimed)"]  # still claimed: not requeued, lost


def test_only_the_claims_of_killed_holders_are_reclaimed_and_only_by_the_lease(tmp_path: Path) -> None:
    """The audit's reclaim (the spool's own, one lease of observation) returns the tasks of a worker whose
    pid the chaos killed; a worker that was not killed (a drain that failed to release) keeps its claim."""
    from hpc.config import load_config
    from hpc.rundir import create_run
    from hpc.spool import Spool

    cfg = load_config(None, ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "model.path=/nonexistent",
                             "spool.lease_s=1", "spool.heartbeat_interval_s=0.2"])
    paths = create_run(tmp_path / "run", cfg)
    spool = Spool(paths.root, cfg.spool)
    spool.put_tasks([{"task_id": t} for t in ("a", "b", "c")])
    killed, drained = spool.claim_task("n1.4242.ab12"), spool.claim_task("n1.5151.cd34")
    assert killed is not None and drained is not None
    assert audit.holder_pid("n1.4242.ab12") == 4242 and audit.holder_pid("raas0") is None
    t0 = now()
    assert audit.reclaim_killed_holders(paths.root, {4242}) == [killed.task_id]
    assert now() - t0 >= 1.0  # a full lease observed first: never early
    assert drained.path.exists() and spool.stats()["tasks_claimed"] == 1
    assert audit.reclaim_killed_holders(paths.root, set()) == []  # nobody killed: nothing moves, no wait


def test_tasks_nothing_trained_fails() -> None:
    assert not audit.check_tasks({"t4": "ready"}, [], set(), {}).ok


def test_a_spool_drop_accounts_for_a_task() -> None:
    check = audit.check_tasks({"t1": "done", "t9": "done"}, [row("t1", "a", 1)], set(), {"t9": "stale"})
    assert check.ok and check.detail["fates"]["dropped:stale"] == 1, check.detail


@pytest.mark.parametrize(("outcomes", "ok"), [
    ({"a": ["result:ok"], "b": ["error:503"], "c": ["dropped:RemoteDisconnected"]}, True),
    ({"a": ["result:ok"], "b": ["result:ok", "result:ok"]}, False),  # answered twice
    ({"a": ["result:ok"], "b": []}, False),  # never answered
    ({"a": ["result:ok"], "b": ["hung"]}, False),
    ({"a": ["result:ok"], "b": ["unnamed:500"]}, False),  # a failure without a reason
    ({"b": ["error:503"]}, False),  # no call got a result
])
def test_process_calls(outcomes: dict[str, list[str]], ok: bool) -> None:
    assert audit.check_calls(outcomes).ok is ok


def test_reloads_bound() -> None:
    seen = [{"version": 3, "seconds": 0.4, "ended": "server gone"}]
    assert audit.check_reloads(seen, [{"version": 2, "seconds": 0.2}], 0).ok
    slow = [{"version": 4, "seconds": audit.RELOAD_BOUND_S + 1, "ended": "server stopped"}]
    assert not audit.check_reloads(seen + slow, [], 0).ok
    assert not audit.check_reloads([], [{"version": 5, "seconds": audit.RELOAD_BOUND_S * 2}], 0).ok


def test_trainer_wait_and_run_down_bounds() -> None:
    assert audit.check_wait(audit.WAIT_BOUND_S, 3).ok and not audit.check_wait(audit.WAIT_BOUND_S + 1, 3).ok
    assert audit.check_run_down(0, {"infer": 1.0, "rollout": 0.0}).ok
    assert not audit.check_run_down(0, {"infer": 1.0, "rollout": audit.RUNDOWN_BOUND_S + 5}).ok
    assert not audit.check_run_down(1, {"infer": 1.0}).ok  # the trainer itself failed
    assert not audit.check_run_down(0, {"infer": 1.0}, ["raas"]).ok  # SIGKILLed after the stop's grace


@pytest.mark.parametrize("kind", ["processes", "zombies_now", "mounts", "cgroups", "scratch_left", "open_claims"])
def test_any_leak_fails(kind: str) -> None:
    found: dict[str, list[str]] = {k: [] for k in ("processes", "zombies_now", "mounts", "cgroups",
                                                   "scratch_left", "open_claims")}
    assert audit.check_leaks(found, 0.0).ok
    assert not audit.check_leaks({**found, kind: ["something"]}, 0.0).ok
    assert not audit.check_leaks(found, audit.ZOMBIE_BOUND_S + 1).ok


def test_an_infrastructure_failure_in_the_loss_fails() -> None:
    status = {"t1:0:0": Status.OK, "t1:1:0": Status.TIMEOUT, "t2:0:0": Status.OK, "t3:0:0": Status.SANDBOX_ERROR}
    assert audit.check_advantages(CLEAN_LEDGER, status).ok
    trained_infra = [*CLEAN_LEDGER[:3], row("t3", "t3:0:0", 2)]
    check = audit.check_advantages(trained_infra, status)
    assert not check.ok and check.detail["entered_the_loss"][0]["status"] == "sandbox_error"
    wrong_reason = [*CLEAN_LEDGER[:3], row("t3", "t3:0:0", 2, "dropped", "stale")]
    assert not audit.check_advantages(wrong_reason, status).ok
    assert not audit.check_advantages(CLEAN_LEDGER, {}).ok  # rows whose shard is nowhere


def test_the_plans_cover_every_role_and_both_trainer_fault_points() -> None:
    for seed in range(5):
        plan = kill_plan(random.Random(seed), 180.0)
        assert {r for _, r in plan} == {"infer", "trainer", "rollout", "raas"}
        assert all(0 < t < 180 for t, _ in plan) and [t for t, _ in plan] == sorted(t for t, _ in plan)
        faults = fault_plan(random.Random(seed), 180.0)
        assert {f.split(":")[0] for f in faults[:2]} == {"checkpoint", "publish"}


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    """A soak harness whose four roles are ``sleep`` processes, all started."""
    h = Harness(tmp_path, seed=0)
    (tmp_path / "logs").mkdir()
    for name in ROLES:
        h.role(name, ["sleep", "60"])
        h.start_role(name)
    yield h
    h.kill_everything()
    for role in h.roles.values():
        role.reap()


def test_a_dropped_call_is_named_only_when_its_server_went_away(harness: Harness,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert chaos_client.attributed_drop("dropped:RemoteDisconnected", True) == "dropped:RemoteDisconnected"
    unexplained = chaos_client.attributed_drop("dropped:RemoteDisconnected", False)
    assert unexplained == "unnamed:dropped:RemoteDisconnected"
    assert not audit.check_calls({"a": ["result:ok"], "b": [unexplained]}).ok
    monkeypatch.setattr(chaos_client, "DROP_WAIT_S", 0.3)
    client = chaos_client.ProcessClient(harness, {})
    raas = harness.roles["raas"]
    first = raas.starts
    assert not client.server_went_away(first)  # alive, not killed, not replaced: the drop has no reason
    raas.signal_group(signal.SIGKILL)
    assert client.server_went_away(first)  # killed by the soak
    raas.reap()
    harness.start_role("raas")
    assert client.server_went_away(first)  # replaced by a new incarnation
    assert not client.server_went_away(raas.starts)


def test_after_the_window_each_role_not_killed_yet_is_killed_and_the_run_resumed_once(harness: Harness) -> None:
    engine = subprocess.Popen(["sleep", "60"])  # the inference engine its endpoint record names
    harness.run.endpoints.mkdir(parents=True)
    write_endpoint(harness.run.endpoints / "infer-0.json",
                   EndpointRecord(role="infer", url="http://127.0.0.1:9", extra={"server_pid": engine.pid}))
    harness.count_kill("rollout", "eval")  # killed in the window
    assert audit.check_chaos(harness.kills_by_role(), 0).detail["never_killed"] == ["infer-server", "trainer", "raas"]
    finish_chaos(harness, Chaos(harness, chaos_client.ProcessClient(harness, {}), now()), resume_pending=True)
    assert engine.wait(timeout=10) == -signal.SIGKILL
    kills = harness.kills_by_role()
    assert kills == {"infer-server": {"serving": 1}, "raas": {"any": 1}, "rollout": {"eval": 1}, "trainer": {"any": 1}}
    assert harness.resumes == 1 and harness.all_alive()
    assert audit.check_chaos(kills, harness.resumes).ok


@pytest.mark.parametrize(("kills", "resumes"), [
    ({"infer-server": {"reload": 1}, "raas": {"call": 1}, "rollout": {"eval": 2}}, 1),  # the trainer never killed
    ({"infer-server": {"reload": 1}, "raas": {"call": 1}, "rollout": {"eval": 2}, "trainer": {"publish": 1}}, 0),
    ({"infer-server": {"reload": 1}, "raas": {"call": 1}, "rollout": {"eval": 2}, "trainer": {"publish": 1}}, 2),
])
def test_chaos_that_did_not_happen_fails(kills: dict[str, dict[str, int]], resumes: int) -> None:
    assert not audit.check_chaos(kills, resumes).ok
