"""The whole run on the real local Slurm (``scripts/local_slurm.sh up``), as the unprivileged CI user.

One heterogeneous job: a train group (DeepSpeed on CPU, gpu partition with a fake GPU), an
inference group (the CPU engine, gpu partition) and a rollout group (bwrap sandboxes, cpu
partition), on the built-in tasks and a tiny model. What is checked:

1. The Python API (``hpc.cli.api.Run``) creates and submits it; it trains; ``run.cancel()`` stops it
   after its first checkpoint; ``run.resume()`` continues from that checkpoint and ``run.wait()``
   returns COMPLETED at ``trainer.total_steps`` (its progress callback's ``run.status()`` documents
   are checked as the CLI's are).
2. Exactly once: every trajectory the rollout nodes wrote (the rows of every shard, wherever the
   shard now lies) has exactly one outcome in the trainer's checkpoint ledgers (trained at a step,
   or dropped with a reason), or is still queued in the spool (ready, or claimed but not covered by
   a checkpoint); nothing is quarantined and no outcome names an unknown trajectory.
3. ``spoolrl status RUN --json`` is polled all along: schema, job/group states, spool counts,
   trainer step and policy version, inference endpoints; they move.
4. The same config through ``spoolrl render`` + plain ``sbatch`` gives the same groups (roles,
   partitions, task counts, GPUs), the same step count and an exactly-once ledger.

Every spoolrl command runs as the CI user with the interpreter its jobs use (``ci_python``), so
nothing in the run directory is created by root. The trainer never builds DeepSpeed's CPU
``shm_comm`` op (gloo does the collectives), so no per-user JIT build precedes the jobs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml

SLURM_TESTS = Path(__file__).resolve().parents[1] / "slurm"
sys.path.insert(0, str(SLURM_TESTS))

from slurm_helpers import CI_USER, SHARED  # noqa: E402


def _slurm_fixtures() -> Any:
    """tests/slurm/conftest.py's fixtures (slurm, ci_user, ci_python), reused rather than copied."""
    spec = importlib.util.spec_from_file_location("spoolrl_slurm_conftest", SLURM_TESTS / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_fx = _slurm_fixtures()
slurm, ci_user, ci_python = _fx.slurm, _fx.ci_user, _fx.ci_python

pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.deepspeed,
              pytest.mark.timeout(900)]

JOB_NAME = "spoolrl-e2e"
TOTAL_STEPS = 6
CHECKPOINT_EVERY = 2
# A setup line: the fake GPU's CUDA_VISIBLE_DEVICES goes into each step's log (torch must stay on CPU).
SHOW_GPUS = 'echo "spoolrl-e2e: CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}" >&2'
ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED")


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def e2e_root(ci_user: str) -> Iterator[Path]:
    root = SHARED / "spoolrl-tests" / f"e2e {uuid.uuid4().hex[:8]} 'it'\"s\" 50%"
    root.mkdir(parents=True)
    shutil.chown(root, CI_USER)
    yield root
    subprocess.run(["scancel", f"--name={JOB_NAME}", f"--user={CI_USER}", "--quiet"], capture_output=True)
    if not os.environ.get("SPOOLRL_E2E_KEEP"):  # keep the run directories to debug a failure
        time.sleep(1)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def e2e_config(e2e_root: Path, ci_python: Path) -> Path:
    """The run config (YAML) both launch paths use."""
    from rollout_node.sandbox import bwrap_unavailable_reason

    if why := bwrap_unavailable_reason():
        pytest.skip(why)
    scratch = e2e_root / "scratch"  # node-local in real life; here every "node" is this host
    scratch.mkdir()
    shutil.chown(scratch, CI_USER)
    data = _config_dict(ci_python, scratch)
    path = e2e_root / "run.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _group(partition: str, python: Path, gpus: int, drain_s: int, setup: list[str] | None = None) -> dict[str, Any]:
    return {"partition": partition, "nodes": 1, "cpus_per_task": 1, "mem_gb": 1.5, "gpus_per_node": gpus,
            "python": str(python), "drain_s": drain_s, "setup": setup or []}


def _config_dict(python: Path, scratch: Path) -> dict[str, Any]:
    """hpc/demo.py's 2-core settings, spread over three het groups."""
    return {
        "run": {"name": "e2e"},
        "model": {"path": "tiny"},
        "trainer": {"precision": "fp32", "zero_stage": 0, "lr": 1e-4, "total_steps": TOTAL_STEPS,
                    "checkpoint_every": CHECKPOINT_EVERY, "micro_batch_tokens": 4096, "max_tasks_outstanding": 4},
        "algorithm": {"group_size": 2, "groups_per_step": 1, "drop_zero_variance": False},
        "rollout": {"policy": "llm", "max_turns": 3, "max_new_tokens_per_turn": 32,
                    "max_tokens": 1536, "run_workers": 2, "eval_workers": 1, "init_workers": 1,
                    "drain_timeout_s": 3.0},
        # heartbeats 4x the default rate: the server is up for only seconds per job here, and the test
        # checks that status shows its counter move
        "inference": {"interface": "lo", "heartbeat_s": 0.5},
        "spool": {"shard_max_age_s": 2.0, "poll_interval_s": 1.0},
        # The rollout node's scratch is per test run: hpc/cli/rollout.py names it
        # <scratch>/spoolrl-rollout for every user, so one made by root (spoolrl demo) blocks the CI user.
        "sandbox": {"scratch_dir": str(scratch)},
        "slurm": {
            "job_name": JOB_NAME, "time_limit_min": 20, "stop_grace_s": 10, "rollout_restart_delay_s": 1,
            "train": _group("gpu", python, 1, 30, [SHOW_GPUS]),
            "infer": _group("gpu", python, 1, 20, [SHOW_GPUS]),
            "rollout": _group("cpu", python, 0, 30),
        },
    }


# ------------------------------------------------------------------------------------ helpers
def _as_ci(cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 180,
           cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    extra = [f"{k}={v}" for k, v in (env or {}).items()]
    return subprocess.run(["runuser", "-u", CI_USER, "--", "env", *extra, *cmd], capture_output=True, text=True,
                          timeout=timeout, cwd=str(cwd or SHARED))


def _spoolrl(python: Path, *args: str, timeout: float = 180) -> str:
    out = _as_ci([str(python), "-m", "hpc.cli", *args], timeout=timeout)
    assert out.returncode == 0, f"spoolrl {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _status(python: Path, run: Path) -> dict[str, Any]:
    return dict(json.loads(_spoolrl(python, "status", str(run), "--json")))


def _batch_logs(run: Path) -> str:
    parts = []
    for f in sorted((run / "logs").glob("slurm-*.out")) + sorted((run / "logs").glob("*/*.log")):
        parts.append(f"--- {f.relative_to(run)}\n{f.read_text(errors='replace')[-2500:]}")
    return "\n".join(parts)


class StatusLog:
    """Every ``spoolrl status --json`` snapshot taken during a run, checked as it comes."""

    def __init__(self, python: Path, run: Path) -> None:
        self.python, self.run = python, run
        self.snapshots: list[dict[str, Any]] = []

    def poll(self) -> dict[str, Any]:
        status = _status(self.python, self.run)
        _check_schema(status, self.run)
        self.snapshots.append(status)
        return status

    def wait(self, what: str, done: Any, timeout_s: float, every_s: float = 3.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.poll()
            if done(status):
                return status
            failed = _finished_jobs_failed(status)
            if failed:
                pytest.fail(f"job(s) failed while waiting for {what}: {failed}\n{_batch_logs(self.run)}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout_s}s waiting for {what}; last status:\n"
                            f"{json.dumps(status, indent=1)[-3000:]}\n{_batch_logs(self.run)}")
            time.sleep(every_s)

    def series(self, *keys: str) -> list[Any]:
        out = []
        for s in self.snapshots:
            value: Any = s
            for k in keys:
                value = value.get(k) if isinstance(value, dict) else None
            out.append(value)
        return out


def _check_schema(status: dict[str, Any], run: Path) -> None:
    assert status["schema"] == 1 and status["run"] == str(run)
    assert set(status) >= {"schema", "run", "time", "jobs", "spool", "trainer", "endpoints", "failures", "errors"}
    assert status["errors"] == {}, status["errors"]
    assert set(status["trainer"]) >= {"policy_version", "checkpoint", "step"}
    for job in status["jobs"]:
        assert set(job) >= {"job_id", "name", "kind", "state", "groups"}
        assert job["kind"] in ("launch", "resume", "scale", "sbatch")
        for g in job["groups"]:
            assert set(g) >= {"index", "role", "state"}
    for e in status["endpoints"]:
        assert set(e) >= {"file", "role", "url", "version", "heartbeat", "age_s"}


def _finished_jobs_failed(status: dict[str, Any]) -> list[str]:
    return [f"{j['job_id']}: {j['state']}" for j in status["jobs"]
            if j["state"].split()[0] in ("FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL")]


def _job_done(status: dict[str, Any], job_id: str) -> bool:
    states = [j["state"] for j in status["jobs"] if j["job_id"] == job_id]
    return bool(states) and states[0].split()[0] not in ACTIVE + ("UNKNOWN",)


def _watch_latest(run: Path, log: StatusLog, timeout_s: float) -> None:
    """Return as soon as checkpoints/LATEST exists (a cheap stat), taking a status snapshot every ~3 s."""
    latest = run / "checkpoints" / "LATEST"
    deadline = time.monotonic() + timeout_s
    next_poll = 0.0
    while not latest.exists():
        if time.monotonic() > next_poll:
            status = log.poll()
            if _finished_jobs_failed(status) or (status["jobs"] and _job_done(status, status["jobs"][0]["job_id"])):
                pytest.fail(f"the job ended before its first checkpoint:\n{_batch_logs(run)}")
            next_poll = time.monotonic() + 3
        if time.monotonic() > deadline:
            pytest.fail(f"no checkpoint after {timeout_s}s:\n{_batch_logs(run)}")
        time.sleep(0.2)


def _check_roles_stopped_cleanly(run: Path, since: float) -> None:
    """scancel = SIGTERM to every step, SIGKILL KillWait later: the inference node stops its servers,
    the rollout node drains; the trainer, if it got to stop before the SIGKILL, checkpointed and
    asked for a requeue (exit 75)."""
    assert [r for r in _metrics(run, "node_stop") if r["t"] >= since and r["process"].startswith("infer-")], \
        f"the inference node did not stop on SIGTERM:\n{_batch_logs(run)}"
    assert [r for r in _metrics(run, "node") if r["t"] >= since and r.get("draining") == "SIGTERM"], \
        f"the rollout node did not drain on SIGTERM:\n{_batch_logs(run)}"
    for stop in (r for r in _metrics(run, "trainer_stop") if r["t"] >= since):
        assert stop["reason"] == "signal:SIGTERM" and stop["exit_code"] == 75, stop


def _check_fake_gpus(run: Path, job_id: str) -> None:
    """The train and infer tasks ran with a (fake, /dev/null) GPU assigned, and worked on the CPU anyway."""
    for role in ("train", "infer"):
        logs = "".join(f.read_text(errors="replace") for f in (run / "logs" / role).glob(f"{job_id}-*.log"))
        assert "spoolrl-e2e: CUDA_VISIBLE_DEVICES=0" in logs, f"{role} step log:\n{logs[-2000:]}"


def _wait_gone(job_id: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i %T"], capture_output=True, text=True)
        if out.returncode == 0 and not out.stdout.strip():
            return
        time.sleep(0.5)
    pytest.fail(f"job {job_id} still in squeue {timeout_s}s after it was cancelled")


def _job(status: dict[str, Any], job_id: str) -> dict[str, Any]:
    return next(j for j in status["jobs"] if j["job_id"] == job_id)


def _step(status: dict[str, Any]) -> int:
    return int(status["trainer"]["step"] or 0)


def _metrics(run: Path, kind: str) -> list[dict[str, Any]]:
    out = []
    for f in sorted((run / "metrics").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line being written by a live process
            if rec.get("kind") == kind:
                out.append(rec)
    return sorted(out, key=lambda r: float(r.get("t", 0)))


# ------------------------------------------------------------------------------------ accounting
def _shard_rows(run: Path) -> dict[str, tuple[str, str, list[str]]]:
    """trajectory id -> (state of its shard, shard id, [task id]) for every shard of the spool."""
    from hpc.shard import decode_table

    shards = run / "spool" / "shards"
    places = [("ready", shards / "ready"), ("committed", shards / "committed"), ("quarantined", shards / "quarantine")]
    places += [("claimed", d) for d in sorted((shards / "claimed").iterdir()) if d.is_dir()]
    rows: dict[str, tuple[str, str, list[str]]] = {}
    for state, directory in places:
        for f in sorted(directory.glob("*.shard")):
            if f.name.startswith("."):
                continue
            sid = f.name.removesuffix(".shard")
            table = decode_table(f.read_bytes(), str(f))
            for traj_id, task_id in zip(table.column("trajectory_id").to_pylist(),
                                        table.column("task_id").to_pylist(), strict=True):
                assert traj_id not in rows, f"trajectory {traj_id} is in two shards ({rows[traj_id][1]}, {sid})"
                rows[traj_id] = (state, sid, [task_id])
    return rows


def check_exactly_once(run: Path, python: Path) -> dict[str, Any]:
    """Every written trajectory: one ledger outcome, or still queued. Returns a summary."""
    from train_node.trainer.checkpoint import read_ledger

    listing = json.loads(_spoolrl(python, "checkpoints", str(run), "--json"))["checkpoints"]
    assert listing, "no checkpoint in the lineage"
    ledger = [e for c in listing for e in read_ledger(_paths(run), c["tag"])]
    latest_meta = json.loads((run / "checkpoints" / listing[-1]["tag"] / "meta.json").read_text())
    resolved_pending = {t for ids in latest_meta["trainer_state"]["consumer"]["resolved"].values() for t in ids}
    rows = _shard_rows(run)
    stats = _status(python, run)["spool"]

    counts = Counter(e["trajectory_id"] for e in ledger)
    twice = {t: n for t, n in counts.items() if n > 1}
    assert not twice, f"trajectories with more than one outcome: {twice}"
    unknown = set(counts) - set(rows)
    assert not unknown, f"ledger outcomes for trajectories no shard holds: {sorted(unknown)[:5]}"
    for e in ledger:
        assert e["outcome"] in ("trained", "dropped"), e
        assert (e["outcome"] == "trained") == ("step" in e) and (e["outcome"] == "dropped") == bool(e.get("reason")), e
        assert rows[e["trajectory_id"]][1] == e["shard_id"], e
    by_state = Counter(state for state, _, _ in rows.values())
    assert by_state["quarantined"] == 0, "a shard was quarantined in a healthy run"
    committed_without = [t for t, (state, _, _) in rows.items() if state == "committed" and t not in counts]
    assert not committed_without, f"committed shards hold rows with no outcome: {committed_without[:5]}"
    for t, (state, sid, _) in rows.items():
        if state in ("ready", "claimed") and t in counts:
            # decided before the shard was covered: the checkpoint remembers it, so it is skipped later
            assert t in resolved_pending, f"{t} of uncovered shard {sid} has an outcome the checkpoint does not hold"
    covered = {sid for c in listing for sid in c["shards"]}
    committed_shards = {sid for state, sid, _ in rows.values() if state == "committed"}
    assert committed_shards == covered, "committed shards differ from those the checkpoints cover"
    assert stats["trajectories_committed"] == by_state["committed"]
    assert stats["trajectories_ready"] == by_state["ready"] and stats["trajectories_claimed"] == by_state["claimed"]
    assert stats["trajectories_quarantined"] == 0 and stats["trajectories_dropped_other"] == 0
    # every task the spool marks done was delivered in a shard (finish_task only after publishing)
    done_tasks = {unquote(n).rpartition("@")[0] for n in os.listdir(run / "spool" / "tasks" / "done") if not n.startswith((".", "h-"))}
    delivered = {task for _, _, tasks in rows.values() for task in tasks}
    assert done_tasks and done_tasks <= delivered, f"tasks done without a delivered group: {sorted(done_tasks - delivered)[:5]}"
    trained_steps = {e["step"] for e in ledger if e["outcome"] == "trained"}
    return {"written": len(rows), "trained": sum(e["outcome"] == "trained" for e in ledger),
            "dropped": Counter(e["reason"] for e in ledger if e["outcome"] == "dropped"),
            "pending": by_state["ready"] + by_state["claimed"] - len(resolved_pending & set(rows)),
            "trained_steps": trained_steps, "checkpoints": [c["tag"] for c in listing]}


def _paths(run: Path) -> Any:
    from hpc.paths import RunPaths

    return RunPaths(run)


# ------------------------------------------------------------------------------------ groups
_GROUP_OPTS = re.compile(r"^#SBATCH --(partition|nodes|ntasks|ntasks-per-node|cpus-per-task|mem|gres)=(\S+)$")


def script_groups(text: str) -> list[dict[str, str]]:
    """The het groups of a batch script: role and sizing options, in order."""
    groups: list[dict[str, str]] = []
    for line in text.splitlines():
        m = re.match(r"^# -- het group (\d+): (\w+)$", line)
        if m:
            groups.append({"role": m.group(2)})
            continue
        m = _GROUP_OPTS.match(line)
        if m and groups:
            groups[-1][m.group(1)] = m.group(2)
    return groups


def sacct_groups(job_id: str) -> list[dict[str, str]]:
    """What Slurm ran for each het component: partition, node kind, tasks of its step."""
    out = subprocess.run(["sacct", "-n", "-P", "-o", "JobID,Partition,NTasks,NodeList", "-j", job_id],
                         capture_output=True, text=True, timeout=60).stdout
    groups: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        jid, part, ntasks, nodes = line.split("|")
        m = re.match(r"^\d+\+(\d+)(?:\.(\d+))?$", jid)
        if not m:
            continue  # the batch step, or an extern step
        g = groups.setdefault(m.group(1), {})
        if m.group(2) is None:
            g.update(partition=part, node_kind=re.sub(r"\d+", "", nodes))
        else:
            g["step_tasks"] = ntasks
    return [groups[k] for k in sorted(groups, key=int)]


def squeue_gres(job_id: str) -> list[str]:
    """GPUs (GRES per node) of each het component while the job runs (sacct here does not record them)."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i|%b"], capture_output=True, text=True,
                         timeout=60).stdout
    rows = sorted((line.split("|") for line in out.splitlines() if "|" in line), key=lambda r: r[0])
    return [r[1] for r in rows]


# ------------------------------------------------------------------------------------ tests
def _api(python: Path, body: str, *args: str, timeout: float = 300) -> list[str]:
    """Run ``body`` (Python; ``Run`` imported, ``argv`` = args) as the CI user; its stdout lines."""
    code = f"import json, sys; from hpc.cli.api import Run; argv = sys.argv[1:]; {body}"
    out = _as_ci([str(python), "-c", code, *args], timeout=timeout)
    assert out.returncode == 0, f"{body} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout.strip().splitlines()


def _launch(python: Path, config: Path, run: Path) -> str:
    return _api(python, "print(Run.create(argv[1], config=argv[0]).submit().job_ids[0])", str(config), str(run))[-1]


def test_launch_cancel_resume_exactly_once(ci_python: Path, e2e_config: Path, e2e_root: Path) -> None:
    run = e2e_root / "launched"
    job1 = _launch(ci_python, e2e_config, run)
    log = StatusLog(ci_python, run)

    # --- first job: runs until the trainer has checkpointed, then is cancelled
    log.wait("the job to run", lambda s: bool(s["jobs"]) and _job(s, job1)["state"] == "RUNNING", timeout_s=120,
             every_s=1)
    gres = squeue_gres(job1)
    (e2e_root / "launched-gres.json").write_text(json.dumps(gres))
    _watch_latest(run, log, timeout_s=480)  # cancel as soon as the first checkpoint exists: steps are quick
    cancelled_at = time.time()
    assert _api(ci_python, "print(Run.open(argv[0]).cancel())", str(run)) == [str([job1])]
    before_cancel = list(log.snapshots)
    groups = _job(before_cancel[-1], job1)["groups"]
    assert [g["role"] for g in groups] == ["train", "infer", "rollout"]
    assert all(g["state"] == "RUNNING" for g in groups), groups
    endpoints = [e for s in before_cancel for e in s["endpoints"]]
    servers = [e for e in endpoints if e["role"] == "infer"]  # besides: rollout presence and loading pins
    assert servers and all(e["url"].startswith("http://127.0.0.1:") for e in servers), endpoints
    assert {e["role"] for e in endpoints} <= {"infer", "rollout", "loading"}, endpoints
    stopped = log.wait("the cancelled job to end", lambda s: _job_done(s, job1), timeout_s=90, every_s=1)
    assert _job(stopped, job1)["state"].startswith("CANCELLED"), _job(stopped, job1)
    # sacct says CANCELLED at once; the steps still have KillWait to act on their SIGTERM (the
    # trainer finishes its step and checkpoints): wait until Slurm has no process of the job left.
    _wait_gone(job1)
    stopped = log.poll()
    step_at_cancel = _step(stopped)
    tag_at_cancel = stopped["trainer"]["checkpoint"]
    assert CHECKPOINT_EVERY <= step_at_cancel < TOTAL_STEPS, f"cancelled at step {step_at_cancel}"
    _check_roles_stopped_cleanly(run, cancelled_at)
    _check_fake_gpus(run, job1)
    starts_before = len(_metrics(run, "trainer_start"))
    mid = check_exactly_once(run, ci_python)  # the ledger holds at every checkpoint, not only at the end

    # --- resume: a new job continues from the checkpoint to total_steps
    job2 = _api(ci_python, "print(Run.open(argv[0]).resume().job_ids[0])", str(run))[-1]
    assert job2 != job1
    # run.wait() until the resumed job ends, its progress callback printing every run.status() it is given
    waited = _api(ci_python, "run = Run.open(argv[0]); state = run.wait(timeout=480, poll_s=1, progress=lambda s: "
                  "print(json.dumps(s, default=str), flush=True)); print(state)", str(run), timeout=540)
    assert waited[-1] == "COMPLETED", f"{waited[-1]}\n{_batch_logs(run)}"
    for line in waited[:-1]:
        status = json.loads(line)
        _check_schema(status, run)
        log.snapshots.append(status)
    final = log.poll()
    assert _job(final, job2)["state"] == "COMPLETED", f"{_job(final, job2)}\n{_batch_logs(run)}"
    assert [j["kind"] for j in final["jobs"]] == ["launch", "resume"]
    assert _step(final) == TOTAL_STEPS

    starts = _metrics(run, "trainer_start")
    assert len(starts) == starts_before + 1
    assert starts[-1]["resumed_from"] == tag_at_cancel and starts[-1]["step"] == step_at_cancel, starts[-1]
    steps = sorted({r["step"] for r in _metrics(run, "train_step")})
    assert steps == list(range(1, TOTAL_STEPS + 1)), steps
    stops = _metrics(run, "trainer_stop")
    assert stops[-1]["reason"] == "total_steps" and stops[-1]["exit_code"] == 0, stops[-1]

    summary = check_exactly_once(run, ci_python)
    assert summary["trained_steps"] == set(range(1, TOTAL_STEPS + 1))
    assert summary["written"] >= mid["written"] and summary["trained"] > mid["trained"]

    # --- status moved while it ran
    assert [st for st in log.series("trainer", "step") if st is not None] == \
        sorted(st for st in log.series("trainer", "step") if st is not None)
    versions = [v for v in log.series("trainer", "policy_version") if v is not None]
    assert versions and versions[-1] > versions[0]
    committed = [s["spool"]["trajectories_committed"] for s in log.snapshots if s["spool"]]
    assert committed[-1] > 0 and committed[-1] >= max(committed)
    beats = [e["heartbeat"] for s in log.snapshots for e in s["endpoints"] if e["heartbeat"] is not None]
    assert len(set(beats)) > 1, "the inference endpoint's heartbeat never moved"
    seen = {(j["job_id"], j["state"].split()[0]) for s in log.snapshots for j in s["jobs"]}
    assert {(job1, "RUNNING"), (job1, "CANCELLED"), (job2, "RUNNING"), (job2, "COMPLETED")} <= seen, seen
    print(f"\n[e2e launch] jobs {job1} (cancelled at step {step_at_cancel}) + {job2}: {summary}")


def test_render_and_plain_sbatch_same_run(ci_python: Path, e2e_config: Path, e2e_root: Path) -> None:
    run = e2e_root / "sbatched"
    _spoolrl(ci_python, "init", str(run), "--config", str(e2e_config), timeout=300)
    script = run / "job.sbatch"
    _spoolrl(ci_python, "render", "--config", str(e2e_config), "--run", str(run), "-o", str(script))
    out = _as_ci(["sbatch", "--parsable", str(script)], cwd=run)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    log = StatusLog(ci_python, run)
    log.wait("the sbatch job to run", lambda s: all(g["state"] == "RUNNING" for g in _job(s, job)["groups"])
             if any(j["job_id"] == job for j in s["jobs"]) else False, timeout_s=120, every_s=1)
    gres = squeue_gres(job)
    final = log.wait("the sbatch job to finish", lambda s: _job_done(s, job), timeout_s=480)
    assert _job(final, job)["state"] == "COMPLETED", f"{_job(final, job)}\n{_batch_logs(run)}"
    assert _job(final, job)["kind"] == "sbatch" and _step(final) == TOTAL_STEPS

    # the same groups as 'spoolrl launch' submits, by script ...
    dry = _spoolrl(ci_python, "launch", "--dry-run", "--config", str(e2e_config), "--run", str(run))
    expected = script_groups(dry)
    assert [g["role"] for g in expected] == ["train", "infer", "rollout"]
    assert script_groups(script.read_text()) == expected
    assert [g["role"] for g in _job(final, job)["groups"]] == ["train", "infer", "rollout"]
    mine = sacct_groups(job)
    assert mine == [{"partition": "gpu", "node_kind": "gpu", "step_tasks": "1"},
                    {"partition": "gpu", "node_kind": "gpu", "step_tasks": "1"},
                    {"partition": "cpu", "node_kind": "cpu", "step_tasks": "1"}], mine
    assert [("gpu" in g) for g in gres] == [True, True, False], gres
    # ... and as Slurm ran them for the job launch_run submitted in the test above
    launched = e2e_root / "launched"
    if (launched / "slurm" / "jobs.json").exists():
        assert script_groups(sorted((launched / "slurm").glob("launch-*.sbatch"))[0].read_text()) == expected
        launch_job = json.loads((launched / "slurm" / "jobs.json").read_text())["jobs"][0]["job_id"]
        assert mine == sacct_groups(launch_job)
        assert gres == json.loads((e2e_root / "launched-gres.json").read_text())

    _check_fake_gpus(run, job)
    summary = check_exactly_once(run, ci_python)
    assert summary["trained_steps"] == set(range(1, TOTAL_STEPS + 1))
    print(f"\n[e2e sbatch] job {job}: {summary}")
