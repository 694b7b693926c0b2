"""The soak's end-of-run checks. Each check is a pure function of what was gathered (so a test can feed
it a ledger with a task trained twice and see it fail); :func:`audit` gathers from the run directory,
the observers and ``/proc``, then runs them all.

The checks (each names its bound in its detail):

- ``tasks``: every task id the trainer issued is trained exactly once (one step in the lineage's
  ledgers) or accounted for with a reason: dropped in the ledger or by the spool, its group still in
  a ready shard, the task still queued, or requeued from a killed holder (below); none finished and
  found nowhere, none left claimed, none trained twice, no ledger row twice.
- ``process_calls``: every ``/process`` call ended exactly once, with a result or a named failure;
  none hung.
- ``reloads``: every weight reload ended (finished, failed, or ended by its server's death) within
  ``RELOAD_BOUND_S``; none still open at the end.
- ``trainer_wait``: no stretch longer than ``WAIT_BOUND_S`` in which a started trainer was alive, a
  shard sat in ``spool/shards/ready`` and no step landed.
- ``run_down``: the trainer ended with 0 and every other role exited within ``RUNDOWN_BOUND_S`` of it;
  at the whole-run stop every role exited on SIGTERM within the grace (none needed the SIGKILL).
- ``leaks``: no process naming the soak's directories, no zombie among the roles' descendants for
  ``ZOMBIE_BOUND_S``, no mount under them, no ``spoolrl-sbx`` pids cgroup of a role's process, no
  episode directory left in scratch, no open task or shard claim in either run's spool.
- ``advantages``: every ledger row of a non-trainable trajectory (infrastructure faults included) is
  ``dropped`` with its status as the reason; none is ``trained``.
- ``chaos``: the soak did what it claims: each role SIGKILLed at least once and the whole run stopped and
  resumed exactly once.

Before the checks, a task claim still held by a process the chaos SIGKILLed goes back to ``ready/``
through the spool's own lease reclaim (:func:`reclaim_killed_holders`), as it would in a resumed run:
a node killed within a lease of the run's end leaves no live node to outwait its lease. Such tasks
count as ``requeued:holder_killed``; a claim of any other holder (one that drained, or was SIGKILLed
only after a time limit's grace) stays open and fails ``leaks`` and ``tasks``.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc.paths import RunPaths
from hpc.trajectory import Status
from scripts.chaos.harness import KILL_NAME, RUNDOWN_BOUND_S, unkilled_roles
from scripts.chaos.observe import ZOMBIE_BOUND_S
from scripts.chaos.procs import ancestors, process_table

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scripts.chaos.client import ProcessClient
    from scripts.chaos.harness import Harness

RELOAD_BOUND_S = 120.0  # a reload of the tiny model takes seconds; 120 s leaves room for a loaded 2-core host
WAIT_BOUND_S = 60.0
RECLAIM_MARGIN_S = 10.0  # past one lease: the reclaim's own polling (every 1 s here) and a loaded host
KEPT_IN_SCRATCH = {"images"}  # the staged image cache outlives episodes by design (sandbox.image_cache_gb)
Row = dict[str, Any]  # one ledger row: task_id, trajectory_id, step, outcome, reason


@dataclass
class Check:
    name: str
    ok: bool
    detail: dict[str, Any]


# --- the checks (pure) -----------------------------------------------------------------------------------


def check_tasks(issued: dict[str, str], ledger: list[Row], unconsumed: set[str], spool_drops: dict[str, str],
                requeued: frozenset[str] = frozenset()) -> Check:
    """``issued``: task id -> where its task file is (ready, claimed, done); ``unconsumed``: task ids
    with a group in a ready or claimed shard; ``spool_drops``: task id -> the spool's drop reason;
    ``requeued``: task ids :func:`reclaim_killed_holders` returned to ready."""
    steps: dict[str, set[int]] = {}
    dropped: dict[str, str] = {}
    for e in ledger:
        if e["outcome"] == "trained":
            steps.setdefault(e["task_id"], set()).add(e["step"])
        else:
            dropped.setdefault(e["task_id"], e.get("reason", "?"))
    fates: Counter[str] = Counter()
    lost = []
    for tid, where in issued.items():
        fate = ("trained" if tid in steps else f"dropped:{dropped[tid]}" if tid in dropped else
                "in_ready_shard" if tid in unconsumed else f"dropped:{spool_drops[tid]}" if tid in spool_drops else
                "requeued:holder_killed" if where == "ready" and tid in requeued else
                "queued" if where == "ready" else "lost")
        fates[fate] += 1
        if fate == "lost":
            lost.append(f"{tid} ({where})")
    twice = sorted(t for t, s in steps.items() if len(s) > 1)
    rows_twice = sorted(k for k, v in Counter(e["trajectory_id"] for e in ledger).items() if v > 1)
    ok = not lost and not twice and not rows_twice and fates["trained"] > 0
    return Check("tasks", ok, {"issued": len(issued), "fates": dict(fates), "lost": lost[:10],
                               "trained_twice": twice[:10], "ledger_rows_twice": rows_twice[:10]})


def check_advantages(ledger: list[Row], status: dict[str, Status]) -> Check:
    """``status``: trajectory id -> its status, from the shards."""
    excluded: Counter[str] = Counter()
    wrong, unknown = [], 0
    for e in ledger:
        st = status.get(e["trajectory_id"])
        if st is None:
            unknown += 1
        elif not st.trainable:
            excluded[e.get("reason", "?")] += 1
            if e["outcome"] != "dropped" or e.get("reason") != st.value:
                wrong.append({**e, "status": st.value})
    infra = sum(1 for e in ledger if (s := status.get(e["trajectory_id"])) is not None and s.infrastructure)
    return Check("advantages", not wrong and unknown == 0,
                 {"ledger_rows": len(ledger), "non_trainable_excluded": dict(excluded), "infrastructure_rows": infra,
                  "entered_the_loss": wrong[:5], "rows_without_shard": unknown})


def check_calls(outcomes: dict[str, list[str]]) -> Check:
    counts = Counter(o for seq in outcomes.values() for o in seq)
    bad = {j: seq for j, seq in outcomes.items() if len(seq) != 1 or seq[0] == "hung" or seq[0].startswith("unnamed")}
    ok = not bad and any(o.startswith("result:") for o in counts)
    return Check("process_calls", ok, {"calls": len(outcomes), "outcomes": dict(counts), "bad": dict(list(bad.items())[:5])})


def check_reloads(seen: list[Row], logged: list[Row], failed: int) -> Check:
    """``seen``: reloads the endpoint records showed (version, seconds, ended); ``logged``: the
    infer-node's ``reload`` records (short ones are seen only there); ``failed``: its ``reload_failed``."""
    spans = seen + [{"version": r.get("version"), "seconds": float(r["seconds"]), "ended": "reload record"}
                    for r in logged]
    slow = [r for r in spans if r["seconds"] > RELOAD_BOUND_S]
    return Check("reloads", not slow,
                 {"bound_s": RELOAD_BOUND_S, "seen": len(seen), "finished": len(logged), "failed": failed,
                  "seen_ended": dict(Counter(r["ended"] for r in seen)),
                  "longest_s": max((r["seconds"] for r in spans), default=0.0), "over_bound": slow[:5]})


def check_wait(longest_s: float, steps: int) -> Check:
    return Check("trainer_wait", longest_s <= WAIT_BOUND_S,
                 {"bound_s": WAIT_BOUND_S, "longest_s": round(longest_s, 1), "steps": steps})


def check_run_down(trainer_exit: int | None, after_trainer_s: dict[str, float],
                   killed_after_grace: Sequence[str] = ()) -> Check:
    """``killed_after_grace``: the roles the whole-run stop had to SIGKILL after its grace."""
    late = {k: v for k, v in after_trainer_s.items() if v > RUNDOWN_BOUND_S}
    hung = list(killed_after_grace)
    return Check("run_down", not late and not hung and trainer_exit == 0,
                 {"bound_s": RUNDOWN_BOUND_S, "trainer_exit": trainer_exit, "after_trainer_s": after_trainer_s,
                  "killed_after_stop_grace": hung})


def check_leaks(found: dict[str, list[str]], zombie_longest_s: float) -> Check:
    """``found``: kind (processes, zombies_now, mounts, cgroups, scratch_left, open_claims) -> what is left."""
    ok = not any(found.values()) and zombie_longest_s <= ZOMBIE_BOUND_S
    return Check("leaks", ok, {**{k: v[:10] for k, v in found.items()}, "zombie_longest_s": round(zombie_longest_s, 1)})


def check_chaos(kills: dict[str, dict[str, int]], resumes: int) -> Check:
    """``kills``: role -> phase -> count, as :meth:`Harness.kills_by_role` gives them."""
    never = [KILL_NAME.get(r, r) for r in unkilled_roles(kills)]
    return Check("chaos", not never and resumes == 1, {"never_killed": never, "whole_run_resumes": resumes})


# --- gathering ---------------------------------------------------------------------------------------------


def holder_pid(worker: str) -> int | None:
    """The process id in a rollout worker's id (``<node>.<pid>.<hex>``, rollout_node.pipeline.node)."""
    parts = worker.rsplit(".", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def reclaim_killed_holders(run: Path, killed_pids: set[int]) -> list[str]:
    """Return the task claims of workers whose process the chaos SIGKILLed to ``ready/`` through the
    spool's own lease reclaim (observed on this clock for at most one lease + RECLAIM_MARGIN_S, as a
    resumed run's nodes would); the task ids so requeued. Other holders' claims are left as they are."""
    from hpc.rundir import open_run
    from hpc.spool import Spool

    paths, config = open_run(run)
    claimed = paths.spool / "tasks" / "claimed"
    killed = {w.name for w in claimed.glob("*") if holder_pid(w.name) in killed_pids}
    held = {f: str(json.loads(f.read_text())["task_id"]) for w in sorted(killed) for f in sorted((claimed / w).glob("*"))}
    if held:
        spool = Spool(run, config.spool)
        deadline = time.monotonic() + config.spool.lease_s + RECLAIM_MARGIN_S
        while any(f.exists() for f in held) and time.monotonic() < deadline:
            spool.tasks.reclaim_expired(among=killed)
            time.sleep(1.0)
    return sorted(t for f, t in held.items() if not f.exists())


def task_files(spool: Path) -> dict[str, str]:
    """task id -> where its task file is (``ready``, ``claimed``, ``done``)."""
    out: dict[str, str] = {}
    tasks = spool / "tasks"
    dirs = [("done", tasks / "done"), ("ready", tasks / "ready")]
    dirs += [("claimed", d) for d in sorted((tasks / "claimed").glob("*"))]
    for where, d in dirs:
        for f in sorted(d.glob("*")):
            try:
                tid = str(json.loads(f.read_text())["task_id"])
            except (OSError, ValueError, KeyError):
                continue
            if where != "done" or tid not in out:
                out[tid] = where
    return out


def shard_rows(spool: Path, states: tuple[str, ...]) -> list[tuple[str, Any]]:
    """(state, trajectory) of every row of the shards in these states."""
    from hpc.shard import read_shard_file, table_trajectories

    out = []
    for state in states:
        for path in sorted((spool / "shards" / state).rglob("*.shard")):
            out += [(state, t) for t in table_trajectories(read_shard_file(path), str(path))]
    return out


def spool_drops(spool: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in sorted((spool / "dropped").glob("*.json")):
        for r in json.loads(f.read_text()).get("trajectories", []):
            out.setdefault(r["task_id"], r["reason"])
    return out


def ledger_rows(run: RunPaths) -> list[Row]:
    from train_node.trainer import checkpoint as ckpt

    return [e for m in ckpt.lineage(run) for e in ckpt.read_ledger(run, m["tag"])]


def find_leaks(h: Harness) -> dict[str, list[str]]:
    out = str(h.out)
    me = {os.getpid(), *ancestors(os.getpid())} - {1}  # init reaps orphans on its own schedule
    tree = process_table()
    spools = [run / "spool" for run in (h.run.root, h.raas)]
    return {
        "processes": [f"{pid} {p.cmdline[:160]}" for pid, p in tree.items() if out in p.cmdline and pid not in me],
        "zombies_now": [f"{pid} {p.comm}" for pid, p in tree.items() if p.state == "Z" and p.ppid in me],
        "mounts": [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines() if out in ln],
        "cgroups": [p.name for p in Path("/sys/fs/cgroup/pids").glob("spoolrl-sbx-*")  # spoolrl-sbx-<owner pid>-<hex>
                    if p.name.split("-")[2].isdigit() and int(p.name.split("-")[2]) in h.zombies.pids],
        "scratch_left": episode_dirs(h.out / "scratch") + episode_dirs(h.out / "scratch-raas"),
        "open_claims": [str(p.relative_to(h.out)) for s in spools
                        for p in [*(s / "tasks" / "claimed").glob("*/*"), *(s / "shards" / "claimed").glob("*/*")]],
    }


def episode_dirs(scratch: Path) -> list[str]:
    """What the roles leave in their scratch dir besides the staged image cache."""
    if not scratch.is_dir():
        return []
    return [str(p.relative_to(scratch)) for p in sorted(scratch.glob("*/*/*")) if p.parent.name not in KEPT_IN_SCRATCH]


def audit(h: Harness, client: ProcessClient, rundown: dict[str, Any]) -> list[Check]:
    requeued = {str(run): reclaim_killed_holders(run, h.killed_pids) for run in (h.run.root, h.raas)}
    spool = h.run.root / "spool"
    rows = shard_rows(spool, ("committed", "ready", "claimed"))
    ledger = ledger_rows(h.run)
    unconsumed = {t.task_id for state, t in rows if state in ("ready", "claimed")}
    leaks = check_leaks(find_leaks(h), h.zombies.worst)
    leaks.detail["requeued_from_killed_holders"] = {Path(k).name: v for k, v in requeued.items() if v}
    return [check_tasks(task_files(spool), ledger, unconsumed, spool_drops(spool),
                        frozenset(requeued[str(h.run.root)])),
            check_calls(client.outcomes),
            check_reloads(h.reloads.done, h.metrics.of("reload"), len(h.metrics.of("reload_failed"))),
            check_wait(h.waits.longest, len(h.metrics.of("train_step"))),
            check_run_down(rundown["trainer_exit"], rundown["after_trainer_s"], h.killed_after_grace),
            leaks,
            check_advantages(ledger, {t.trajectory_id: t.status for _, t in rows}),
            check_chaos(h.kills_by_role(), h.resumes)]
