"""``scripts/soak.py --minutes M [--seed S] [--out DIR]``: the demo loop under random SIGKILLs, then an audit.

What runs (every part real, as ``spoolrl demo`` starts it): the CPU inference engine under its
supervisor (``spoolrl infer-node``), a rollout node with bwrap sandboxes and EVAL, the DeepSpeed
trainer on CPU, and beside them ``spoolrl rollout-server`` on a run directory of its own, answering
``/process`` calls from a small client loop in this script (one call at a time, against the same
inference server).

For ``M`` minutes (the chaos window, counted from the trainer's first start) this script plays
Slurm and the node supervisors. At moments drawn from ``--seed`` it SIGKILLs one of:

- the rollout node's process group (sometimes while an EVAL runs in one of its sandboxes);
- one inference server (sometimes while it reloads a new policy version); ``infer-node`` restarts it;
- the trainer's process group (from outside at a random instant; besides, some trainer incarnations
  start with ``SPOOLRL_FAULT=checkpoint:1`` or ``publish:N`` and SIGKILL themselves in the middle of
  writing a checkpoint or a policy version);
- the rollout-server's process group (the client's calls in flight get a dropped connection).

A killed role is started again on the same run directory (a requeue), and once per soak the whole
run is stopped (SIGTERM to every role, SIGKILL after 60 s, as at a time limit) and started again
as a new allocation would (``spoolrl resume``: the same run directory, a new fencing generation).
At the end the run drains (``RUN/control/STOP``) and the audit prints one line per check and a JSON
summary; the exit status is 1 if any check failed. The checks:

- ``tasks``: every task id the trainer issued is trained exactly once (one step in the lineage's
  ledgers) or accounted for with a reason: dropped in the ledger or by the spool, its group still in
  a ready shard, or the task still queued; none finished and found nowhere, none trained twice.
- ``process_calls``: every ``/process`` call ended exactly once, with a result or a named failure
  (an HTTP error with a body, or the connection dropped by a killed server); none outlived
  ``service.timeout_s`` + 60 s.
- ``reloads``: every weight reload seen in ``endpoints/`` (``loading`` set) ended within
  ``RELOAD_BOUND_S``: finished, failed, or ended by its server's death; none still open.
- ``trainer_wait``: no stretch longer than 60 s in which a started trainer was alive, a shard sat
  unclaimed in ``spool/shards/ready`` and no step landed.
- ``run_down``: every role exited within 60 s after the trainer ended.
- ``leaks``: no process naming the soak's directories, no zombie among the roles' descendants
  (seen for 30 s), no mount under the scratch dirs, no ``spoolrl-*`` pids cgroup, no episode
  directory left in scratch, no open task or shard claim in either run's spool.
- ``advantages``: every ledger row of a trajectory with an infrastructure status (or any other
  non-trainable one) is ``dropped`` with that status as its reason; no such row is ``trained``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpc.paths import RunPaths  # noqa: E402

SPOOLRL = [sys.executable, "-m", "hpc.cli"]
RELOAD_BOUND_S = 120.0  # a reload of the tiny model takes seconds; 120 s leaves room for a loaded 2-core host
WAIT_BOUND_S = 60.0
RUNDOWN_BOUND_S = 60.0
ZOMBIE_BOUND_S = 30.0
SERVICE_TIMEOUT_S = 120
# the rollout-server beside the run has a secret of its own: it reaches the run's inference server as a
# trusted-network client would (weight reloads still need the run's secret)
SOAK_OVERRIDES = ["run.name=soak", "trainer.checkpoint_every=2", "inference.require_auth_all=false"]
RAAS_OVERRIDES = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "spool.poll_interval_s=0.2",
                  "spool.heartbeat_interval_s=1", "spool.shard_max_trajectories=1", "spool.lease_s=30",
                  "rollout.run_workers=2", "rollout.init_workers=1", "rollout.eval_workers=1",
                  "inference.max_retries=1", "rollout.max_retries=1", f"service.timeout_s={SERVICE_TIMEOUT_S}"]
PROCESS_INSTANCE = "spoolrl__intervals-1"
KEPT_IN_SCRATCH = {"images"}  # the staged image cache outlives episodes by design (sandbox.image_cache_gb)


def now() -> float:
    return time.monotonic()


# --- roles: start, kill, restart (what Slurm and the supervisors do) ----------------------------------------


@dataclass
class Role:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    starts: int = 0
    killed: bool = False  # this incarnation was SIGKILLed by the soak
    ended_at: float | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        self.env = env or {}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env={**os.environ, **self.env}, cwd=ROOT)
        self.started, self.starts, self.killed, self.ended_at = now(), self.starts + 1, False, None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, signum: int) -> None:
        if self.proc is not None:
            self.killed = self.killed or signum == signal.SIGKILL
            try:
                os.killpg(self.proc.pid, signum)
            except ProcessLookupError:
                pass


class Soak:
    """The run, its roles, the kill plan and what the monitor observed."""

    def __init__(self, out: Path, seed: int, minutes: float) -> None:
        self.out, self.rng, self.window_s = out, random.Random(seed), minutes * 60.0
        self.run = RunPaths(out / "run")
        self.raas = out / "raas"
        self.kills: Counter[str] = Counter()
        self.events: list[dict[str, Any]] = []
        self.roles: dict[str, Role] = {}
        self.fault_plan: list[str] = []
        self.paused = False
        self.t0 = now()
        self.metrics = MetricsTail(self.run)
        self.reloads = Reloads()
        self.waits = Waits(self.metrics)
        self.zombies = Zombies()
        self._observed = 0.0

    def role(self, name: str, argv: list[str]) -> None:
        self.roles[name] = Role(name, argv, self.out / "logs" / f"{name}.log")

    def event(self, what: str, **fields: Any) -> None:
        rec = {"t": round(now() - self.t0, 1), "event": what, **fields}
        self.events.append(rec)
        print(json.dumps({"soak": "event", **rec}), flush=True)

    def trainer_env(self) -> dict[str, str]:
        """Some incarnations SIGKILL themselves mid-checkpoint or mid-publish (train_node.trainer.faults)."""
        fault = self.fault_plan.pop(0) if self.fault_plan else ""
        return {"SPOOLRL_FAULT": fault, "OMP_NUM_THREADS": "1"}

    def start_role(self, name: str) -> None:
        role = self.roles[name]
        env = self.trainer_env() if name == "trainer" else {}
        role.start(env)
        self.event("start", role=name, incarnation=role.starts, **({"fault": env["SPOOLRL_FAULT"]} if env.get("SPOOLRL_FAULT") else {}))

    def supervise(self) -> None:
        """Restart every role that died (a requeue, or the supervisor); note self-inflicted trainer kills."""
        for name in self.roles:
            self.supervise_one(name)

    def supervise_one(self, name: str) -> None:
        role = self.roles[name]
        if role.proc is not None and not role.alive():
            code = role.proc.returncode
            if role.killed:
                pass  # counted when the soak killed it
            elif name == "trainer" and code == -signal.SIGKILL and role.env.get("SPOOLRL_FAULT"):
                point = role.env["SPOOLRL_FAULT"].split(":")[0]
                self.kills[f"trainer@{point}"] += 1
                self.event("kill", role="trainer", how=f"fault point {point}")
            else:
                self.event("exited", role=name, code=code)
            self.start_role(name)

    # --- the kills -------------------------------------------------------------------------------------------

    def kill(self, target: str) -> None:
        """SIGKILL one role (its variant drawn from the seed); the supervision loop brings it back."""
        variant = self.rng.random() < 0.5
        if target == "infer":
            self.kill_infer_server(mid_reload=variant)
            return
        role = self.roles[target]
        how = "at a random instant"
        if target == "rollout" and variant and self.wait_for(lambda: bool(self.eval_pids()), 30.0):
            how = "mid-EVAL"
        if not role.alive():
            return
        role.signal_group(signal.SIGKILL)
        self.kills[target] += 1
        self.event("kill", role=target, how=how)

    def kill_infer_server(self, mid_reload: bool) -> None:
        how = "at a random instant"
        if mid_reload and self.wait_for(lambda: any(r.get("loading") is not None for r in self.infer_records()), 30.0):
            how = "mid-reload"
        records = self.infer_records()
        if not records or not records[0].get("server_pid"):
            self.event("kill_skipped", role="infer-server", why="no server announced")
            return
        rec = next((r for r in records if r.get("loading") is not None), records[0])
        try:
            os.kill(int(rec["server_pid"]), signal.SIGKILL)
        except ProcessLookupError:
            return
        self.kills["infer-server"] += 1
        self.event("kill", role="infer-server", how=how, loading=rec.get("loading"), pid=rec["server_pid"])

    def wait_for(self, predicate: Any, limit_s: float) -> bool:
        deadline = now() + limit_s
        while now() < deadline:
            if predicate():
                return True
            self.observe()
            time.sleep(0.2)
        return False

    def infer_records(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.run.endpoints.glob("infer-*.json")):
            try:
                out.append({"file": path.name, **json.loads(path.read_text())})
            except (OSError, ValueError):
                continue
        return out

    def eval_pids(self) -> list[int]:
        """Processes of the rollout node running an EVAL's tests (EVAL alone runs ``env -i PATH=...``
        inside its sandbox: rollout_node.tasks.harness.build_test_argv)."""
        role = self.roles["rollout"]
        if not role.alive() or role.proc is None:
            return []
        tree = process_table()
        return [pid for pid in descendants(tree, role.proc.pid) if " env -i PATH=" in tree[pid].cmdline]

    # --- whole-run stop and resume (a new allocation) -----------------------------------------------------------

    def stop_all(self, why: str) -> None:
        """SIGTERM every role (as at a time limit), SIGKILL what is left after 60 s."""
        self.paused = True
        for role in self.roles.values():
            role.signal_group(signal.SIGTERM)
        deadline = now() + 60.0
        while any(r.alive() for r in self.roles.values()) and now() < deadline:
            self.observe()
            time.sleep(0.5)
        late = [name for name, r in self.roles.items() if r.alive()]
        for name in late:
            self.roles[name].signal_group(signal.SIGKILL)
        for role in self.roles.values():
            if role.proc is not None:
                role.proc.wait()
        self.event("run_stopped", why=why, killed_after_60s=late)

    def resume_all(self) -> None:
        self.run.stop_marker.unlink(missing_ok=True)
        for name in ("infer", "trainer", "rollout", "raas"):
            self.start_role(name)
        self.paused = False
        self.event("run_resumed")

    # --- observation (every second) ---------------------------------------------------------------------------

    def observe(self) -> None:
        t = now()
        if t - self._observed < 1.0:
            return
        self._observed = t
        self.reloads.observe(self.infer_records(), t)
        self.waits.observe(self.trainer_started(), ready_shards(self.run), t)
        self.zombies.observe([r.proc.pid for r in self.roles.values() if r.proc is not None and r.alive()], t)

    def trainer_started(self) -> bool:
        """The current trainer incarnation is alive and logged ``trainer_start`` (setup done)."""
        role = self.roles["trainer"]
        if not role.alive():
            return False
        wall_start = time.time() - (now() - role.started)
        return any(r["t"] >= wall_start for r in self.metrics.of("trainer_start"))


class Reloads:
    """Every reload seen in endpoints/ (``loading`` set): when it began and how it ended."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, Any, int], float] = {}
        self.done: list[dict[str, Any]] = []

    def observe(self, records: list[dict[str, Any]], t: float) -> None:
        live = {(r["file"], r.get("server_pid"), r["loading"]) for r in records if r.get("loading") is not None}
        for key in live - set(self.open):
            self.open[key] = t
        servers = {(r["file"], r.get("server_pid")) for r in records}
        for key in set(self.open) - live:
            ended = "finished or failed" if key[:2] in servers else "server gone"
            self.done.append({"version": key[2], "seconds": round(t - self.open.pop(key), 1), "ended": ended})

    def close_all(self, t: float, why: str) -> None:
        for key, t0 in self.open.items():
            self.done.append({"version": key[2], "seconds": round(t - t0, 1), "ended": why})
        self.open.clear()


class Waits:
    """Longest stretch with a started trainer alive, a shard waiting in ready/ and no step landing."""

    def __init__(self, metrics: MetricsTail) -> None:
        self.metrics, self.longest, self.steps_seen = metrics, 0.0, 0
        self.since: float | None = None

    def observe(self, trainer_up: bool, ready: set[str], t: float) -> None:
        steps = len(self.metrics.of("train_step"))
        stepped, self.steps_seen = steps > self.steps_seen, steps
        if not trainer_up or not ready or stepped:
            self.since = None
            return
        self.since = t if self.since is None else self.since
        self.longest = max(self.longest, t - self.since)


class Zombies:
    """Zombies among the roles' descendants, by (pid, start time); a leak if seen for ZOMBIE_BOUND_S.
    Also remembers every pid of the roles' trees."""

    def __init__(self) -> None:
        self.first: dict[tuple[int, str], float] = {}
        self.worst = 0.0
        self.examples: list[str] = []
        self.pids: set[int] = set()  # every process of the roles seen (owners of sandbox cgroups)

    def observe(self, roots: list[int], t: float) -> None:
        tree = process_table()
        for root in roots:
            self.pids.add(root)
            for pid in descendants(tree, root):
                self.pids.add(pid)
                proc = tree[pid]
                if proc.state == "Z":
                    key = (pid, proc.start)
                    self.first.setdefault(key, t)
                    if t - self.first[key] > self.worst:
                        self.worst = t - self.first[key]
                        self.examples = [f"{pid} {proc.comm}"]


class MetricsTail:
    """The run's metrics records, read incrementally (each file from where the last read ended)."""

    def __init__(self, run: RunPaths) -> None:
        self.run = run
        self.offsets: dict[Path, int] = {}
        self.records: dict[str, list[dict[str, Any]]] = {}

    def of(self, kind: str) -> list[dict[str, Any]]:
        self.refresh()
        return self.records.get(kind, [])

    def refresh(self) -> None:
        for path in sorted(self.run.metrics.glob("*.jsonl")):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1  # a torn last line is read again next time
            self.offsets[path] = self.offsets.get(path, 0) + end
            for line in data[:end].splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                self.records.setdefault(str(rec.get("kind")), []).append(rec)


# --- /proc ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    ppid: int
    state: str
    start: str
    comm: str
    cmdline: str


def process_table() -> dict[int, Proc]:
    out = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        comm = stat[stat.index("(") + 1: stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2:].split()
        out[int(d.name)] = Proc(int(rest[1]), rest[0], rest[19], comm, cmd)
    return out


def descendants(tree: dict[int, Proc], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, proc in tree.items():
        children.setdefault(proc.ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def ready_shards(run: RunPaths) -> set[str]:
    try:
        return {n for n in os.listdir(run.root / "spool" / "shards" / "ready") if n.endswith(".shard")}
    except OSError:
        return set()


# --- the /process client ----------------------------------------------------------------------------------------


class ProcessClient:
    """One ``/process`` call at a time against the rollout-server, written from the wire format alone.

    Every call's outcome is recorded once: ``result:<status>``, ``error:<http code>`` (a named
    failure: the body says why), ``dropped:<exception>`` (the connection dropped: its server was
    killed) or ``hung`` (no answer within service.timeout_s + 60 s)."""

    def __init__(self, soak: Soak, instance: dict[str, Any]) -> None:
        self.soak, self.instance = soak, instance
        self.outcomes: dict[str, list[str]] = {}
        self.stopping = threading.Event()
        self.backend: tuple[float, str] | None = None
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        n = 0
        while not self.stopping.is_set():
            server = self.server()
            if server is None or self.soak.paused:
                time.sleep(1.0)
                continue
            url, token = server
            if not self.ensure_backend(url, token):
                time.sleep(1.0)
                continue
            n += 1
            job = f"soak-{n}"
            body = {"instance": self.instance, "job_id": job, "sampling_params": {"max_iterations": 2}}
            outcome = self.call(url, token, body)
            self.outcomes.setdefault(job, []).append(outcome)
            if not outcome.startswith("result:"):
                time.sleep(2.0)  # a client backs off after a failure (and a killed server needs a moment)

    def call(self, url: str, token: str, body: dict[str, Any]) -> str:
        try:
            code, answer = http(url, "/process", body, token, SERVICE_TIMEOUT_S + 60.0)
        except TimeoutError:
            return "hung"
        except urllib.error.URLError as exc:
            return "hung" if isinstance(exc.reason, TimeoutError) else f"dropped:{type(exc.reason).__name__}"
        except (OSError, ValueError) as exc:
            return f"dropped:{type(exc).__name__}"
        if code == 200 and isinstance(answer, dict) and "status" in answer:
            return f"result:{answer['status']}"
        named = isinstance(answer, dict) and any(answer.get(k) for k in ("detail", "error", "message"))
        return f"error:{code}" if named else f"unnamed:{code}"

    def server(self) -> tuple[str, str] | None:
        """(url, token) of the current rollout-server incarnation, once it announced itself."""
        role = self.soak.roles["raas"]
        record = self.soak.raas / "endpoints" / "rollout-server.json"
        try:
            if not role.alive() or record.stat().st_mtime < time.time() - (now() - role.started):
                return None
            data = json.loads(record.read_text())
            return str(data["url"]), Path(data["token_file"]).read_text().strip()
        except (OSError, ValueError, KeyError):
            return None

    def ensure_backend(self, url: str, token: str) -> bool:
        """Point the rollout-server at the inference server now announced (a restart changes its port)."""
        records = [r for r in self.soak.infer_records() if r.get("url")]
        if not records:
            return False
        want = (self.soak.roles["raas"].started, str(records[0]["url"]))
        if self.backend == want:
            return True
        try:
            if self.backend is None or self.backend[0] != want[0]:
                http(url, "/start", {}, token, 30.0)  # a new incarnation starts stopped (400: already running)
            http(url, "/clear_llm_server", {}, token, 30.0)
            code, _ = http(url, "/add_llm_server", {"address": want[1] + "/v1"}, token, 30.0)
        except (OSError, ValueError):
            return False
        self.backend = want if code == 200 else None
        return code == 200


def http(url: str, path: str, body: Any, token: str, timeout_s: float) -> tuple[int, Any]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


# --- the audit ----------------------------------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    ok: bool
    detail: dict[str, Any]


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


def ledger_rows(run: RunPaths) -> list[dict[str, Any]]:
    from train_node.trainer import checkpoint as ckpt

    return [e for m in ckpt.lineage(run) for e in ckpt.read_ledger(run, m["tag"])]


def audit_tasks(run: RunPaths, ledger: list[dict[str, Any]], rows: list[tuple[str, Any]]) -> Check:
    steps: dict[str, set[int]] = {}
    dropped: dict[str, str] = {}
    for e in ledger:
        if e["outcome"] == "trained":
            steps.setdefault(e["task_id"], set()).add(e["step"])
        else:
            dropped.setdefault(e["task_id"], e.get("reason", "?"))
    unconsumed = {t.task_id for state, t in rows if state in ("ready", "claimed")}
    spool_drops: dict[str, str] = {}
    for f in sorted((run.root / "spool" / "dropped").glob("*.json")):
        for r in json.loads(f.read_text()).get("trajectories", []):
            spool_drops.setdefault(r["task_id"], r["reason"])
    rows_seen = Counter(e["trajectory_id"] for e in ledger)
    fates: Counter[str] = Counter()
    lost, twice = [], sorted(t for t, s in steps.items() if len(s) > 1)
    for tid, where in task_files(run.root / "spool").items():
        fate = ("trained" if tid in steps else f"dropped:{dropped[tid]}" if tid in dropped else
                "in_ready_shard" if tid in unconsumed else f"dropped:{spool_drops[tid]}" if tid in spool_drops else
                "queued" if where == "ready" else "lost")
        fates[fate] += 1
        if fate == "lost":
            lost.append(f"{tid} ({where})")
    ledger_twice = sorted(k for k, v in rows_seen.items() if v > 1)
    ok = not lost and not twice and not ledger_twice and fates["trained"] > 0
    return Check("tasks", ok, {"issued": sum(fates.values()), "fates": dict(fates), "lost": lost[:10],
                               "trained_twice": twice[:10], "ledger_rows_twice": ledger_twice[:10]})


def audit_advantages(ledger: list[dict[str, Any]], rows: list[tuple[str, Any]]) -> Check:
    status = {t.trajectory_id: t.status for _, t in rows}
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


def audit_calls(client: ProcessClient) -> Check:
    outcomes = Counter(o for seq in client.outcomes.values() for o in seq)
    bad = {j: seq for j, seq in client.outcomes.items()
           if len(seq) != 1 or seq[0] == "hung" or seq[0].startswith("unnamed")}
    ok = not bad and any(o.startswith("result:") for o in outcomes)
    return Check("process_calls", ok, {"calls": len(client.outcomes), "outcomes": dict(outcomes), "bad": dict(list(bad.items())[:5])})


def audit_reloads(soak: Soak) -> Check:
    """Reloads the endpoint files showed (sampled each second: short ones are seen only in the
    metrics) and every ``reload`` record of the infer-node; each ended within the bound."""
    seen = soak.reloads.done
    logged = [{"version": r.get("version"), "seconds": float(r["seconds"]), "ended": "reload record"}
              for r in soak.metrics.of("reload")]
    failed = len(soak.metrics.of("reload_failed"))
    spans = seen + logged
    slow = [r for r in spans if r["seconds"] > RELOAD_BOUND_S]
    return Check("reloads", not slow,
                 {"bound_s": RELOAD_BOUND_S, "seen": len(seen), "finished": len(logged), "failed": failed,
                  "seen_ended": dict(Counter(r["ended"] for r in seen)),
                  "longest_s": max((r["seconds"] for r in spans), default=0.0), "over_bound": slow[:5]})


def audit_leaks(soak: Soak) -> Check:
    out = str(soak.out)
    me = {os.getpid(), *ancestors(os.getpid())} - {1}  # init reaps orphans on its own schedule
    tree = process_table()
    procs = [f"{pid} {p.cmdline[:160]}" for pid, p in tree.items() if out in p.cmdline and pid not in me]
    zombies = [f"{pid} {p.comm}" for pid, p in tree.items() if p.state == "Z" and p.ppid in me]
    mounts = [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines() if out in ln]
    cgroups = [p.name for p in Path("/sys/fs/cgroup/pids").glob("spoolrl-sbx-*")  # spoolrl-sbx-<owner pid>-<hex>
               if p.name.split("-")[2].isdigit() and int(p.name.split("-")[2]) in soak.zombies.pids]
    scratch = episode_dirs(soak.out / "scratch") + episode_dirs(soak.out / "scratch-raas")
    claims = [str(p.relative_to(soak.out)) for run in (soak.run.root, soak.raas)
              for p in [*(run / "spool" / "tasks" / "claimed").glob("*/*"), *(run / "spool" / "shards" / "claimed").glob("*/*")]]
    detail = {"processes": procs[:5], "zombies_now": zombies, "zombie_longest_s": round(soak.zombies.worst, 1),
              "zombie_examples": soak.zombies.examples, "mounts": mounts[:5], "cgroups": cgroups,
              "scratch_left": scratch[:10], "open_claims": claims[:10]}
    ok = not (procs or zombies or mounts or cgroups or scratch or claims) and soak.zombies.worst <= ZOMBIE_BOUND_S
    return Check("leaks", ok, detail)


def ancestors(pid: int) -> list[int]:
    tree, out = process_table(), []
    while pid in tree and pid > 1:
        pid = tree[pid].ppid
        out.append(pid)
    return out


def episode_dirs(scratch: Path) -> list[str]:
    """What the roles leave in their scratch dir besides the staged image cache."""
    if not scratch.is_dir():
        return []
    return [str(p.relative_to(scratch)) for p in sorted(scratch.glob("*/*/*")) if p.parent.name not in KEPT_IN_SCRATCH]


# --- the soak ------------------------------------------------------------------------------------------------------

ROLES = ("rollout", "infer", "trainer", "raas")


def kill_plan(rng: random.Random, window_s: float) -> list[tuple[float, str]]:
    """(seconds into the window, role) of every kill: each role at least once, then at random."""
    n = max(len(ROLES), int(window_s // 90))
    targets = list(ROLES)
    rng.shuffle(targets)
    targets += [rng.choice(ROLES) for _ in range(n - len(ROLES))]
    times = sorted(rng.uniform(0.05, 0.9) * window_s for _ in range(n))
    return list(zip(times, targets, strict=True))


def fault_plan(rng: random.Random, window_s: float) -> list[str]:
    """SPOOLRL_FAULT of successive trainer incarnations: one mid-checkpoint and one mid-publish, then some."""
    plan = ["checkpoint:1", f"publish:{rng.randint(1, 3)}"]
    rng.shuffle(plan)
    more = [rng.choice(["", "", "checkpoint:1", f"publish:{rng.randint(1, 3)}"]) for _ in range(int(window_s // 300))]
    return plan + more


def builtin_instance() -> dict[str, Any]:
    for line in (ROOT / "rollout_node/tasks/builtin/tasks.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["instance_id"] == PROCESS_INSTANCE:
            return {**row, "data_source": "swe_bench"}
    raise SystemExit(f"soak: {PROCESS_INSTANCE} is not among the built-in tasks")


def prepare(out: Path, seed: int, minutes: float) -> Soak:
    from hpc.cli.demo_run import check_sandbox, demo_config
    from hpc.cli.run import init_run

    if (out / "run" / "run.yaml").exists():
        raise SystemExit(f"soak: {out} already holds a soak; pass a new --out")
    config = demo_config(100000, [*SOAK_OVERRIDES, f"sandbox.scratch_dir={out / 'scratch'}"])
    check_sandbox(config)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    soak = Soak(out, seed, minutes)
    init_run(str(soak.run.root), config)
    run = str(soak.run.root)
    soak.role("infer", [*SPOOLRL, "infer-node", run])
    soak.role("trainer", [*SPOOLRL, "train-node", run])
    soak.role("rollout", [*SPOOLRL, "rollout-node", run, "--node-id", "soak-n1"])
    soak.role("raas", [*SPOOLRL, "rollout-server", "--run", str(soak.raas), "--host", "127.0.0.1", "--port", "0",
                       f"model.path={config.model.path}", f"sandbox.scratch_dir={out / 'scratch-raas'}", *RAAS_OVERRIDES])
    soak.fault_plan = fault_plan(soak.rng, soak.window_s)
    return soak


def chaos(soak: Soak) -> None:
    """The window: supervise, kill on schedule, stop and resume the whole run once."""
    for name in ("infer", "trainer", "rollout", "raas"):
        soak.start_role(name)
    if not soak.wait_for(soak.trainer_started, 900.0):
        raise SystemExit("soak: the trainer did not start within 900 s; see " + str(soak.out / "logs"))
    t_start = now()
    plan = kill_plan(soak.rng, soak.window_s)
    resume_s = soak.rng.uniform(0.35, 0.65) * soak.window_s
    soak.event("chaos", window_s=soak.window_s, kills=[[round(t), r] for t, r in plan], resume_at=round(resume_s))
    resume_at: float | None = resume_s
    while (elapsed := now() - t_start) < soak.window_s:
        soak.observe()
        soak.supervise()
        if plan and elapsed >= plan[0][0]:
            soak.kill(plan.pop(0)[1])
        elif resume_at is not None and elapsed >= resume_at:
            resume_at = None
            soak.stop_all("once per soak: a new allocation")
            soak.resume_all()
        time.sleep(0.5)


def run_down(soak: Soak, client: ProcessClient) -> dict[str, Any]:
    """Drain: STOP for the run, SIGTERM for the rollout-server; times each role's exit after the trainer's."""
    client.stopping.set()
    client.thread.join(SERVICE_TIMEOUT_S + 90)
    soak.fault_plan = []  # a trainer requeued now drains cleanly
    soak.run.stop_marker.write_text("soak finished\n")
    soak.roles["raas"].signal_group(signal.SIGTERM)
    soak.event("stop")
    deadline = now() + 900.0
    trainer = soak.roles["trainer"]
    while now() < deadline and not (trainer.proc is not None and trainer.proc.poll() == 0):
        soak.observe()
        if not trainer.alive():
            soak.supervise_one("trainer")
        time.sleep(0.5)
    trainer_end = now()
    others = [r for r in soak.roles.values() if r is not trainer]
    while now() < trainer_end + RUNDOWN_BOUND_S + 30 and any(r.alive() for r in others):
        for r in others:
            if r.ended_at is None and not r.alive():
                r.ended_at = now()
        soak.observe()
        time.sleep(0.5)
    outlived = {r.name: round((r.ended_at or now()) - trainer_end, 1) for r in others}
    for r in others:
        r.signal_group(signal.SIGKILL)
        if r.proc is not None:
            r.proc.wait()
    soak.reloads.close_all(now(), "server stopped")
    return {"trainer_exit": trainer.proc.returncode if trainer.proc else None, "after_trainer_s": outlived}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, required=True, help="length of the chaos window (after the first trainer start)")
    p.add_argument("--seed", type=int, default=0, help="draws the kill moments, targets and variants")
    p.add_argument("--out", type=Path, default=None, help="a new directory for the runs and logs (default: ./runs/soak-<time>)")
    args = p.parse_args(argv)
    if args.minutes <= 0:
        p.error(f"--minutes must be > 0, not {args.minutes}")
    out = (args.out or Path.cwd() / "runs" / time.strftime("soak-%Y%m%d-%H%M%S")).resolve()
    soak = prepare(out, args.seed, args.minutes)
    client = ProcessClient(soak, builtin_instance())
    soak.t0 = now()
    try:
        client.thread.start()
        chaos(soak)
        rundown = run_down(soak, client)
    finally:
        for role in soak.roles.values():
            role.signal_group(signal.SIGKILL)
    checks = audit(soak, client, rundown)
    summary = {"soak": "summary", "out": str(out), "seed": args.seed, "minutes": args.minutes,
               "elapsed_s": round(now() - soak.t0, 1), "kills": dict(soak.kills),
               "starts": {n: r.starts for n, r in soak.roles.items()},
               "checks": {c.name: {"ok": c.ok, **c.detail} for c in checks}}
    for c in checks:
        print(f"soak check {c.name}: {'ok' if c.ok else 'FAILED'} {json.dumps(c.detail, default=str)}", flush=True)
    print(json.dumps(summary, default=str), flush=True)
    (out / "soak.json").write_text(json.dumps(summary, default=str, indent=1))
    return 0 if all(c.ok for c in checks) else 1


def audit(soak: Soak, client: ProcessClient, rundown: dict[str, Any]) -> list[Check]:
    spool = soak.run.root / "spool"
    rows = shard_rows(spool, ("committed", "ready", "claimed"))
    ledger = ledger_rows(soak.run)
    wait = Check("trainer_wait", soak.waits.longest <= WAIT_BOUND_S,
                 {"bound_s": WAIT_BOUND_S, "longest_s": round(soak.waits.longest, 1),
                  "steps": len(soak.metrics.of("train_step"))})
    late = {k: v for k, v in rundown["after_trainer_s"].items() if v > RUNDOWN_BOUND_S}
    down = Check("run_down", not late and rundown["trainer_exit"] == 0, {"bound_s": RUNDOWN_BOUND_S, **rundown})
    return [audit_tasks(soak.run, ledger, rows), audit_calls(client), audit_reloads(soak), wait, down,
            audit_leaks(soak), audit_advantages(ledger, rows)]


if __name__ == "__main__":
    sys.exit(main())
