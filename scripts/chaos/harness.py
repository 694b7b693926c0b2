"""The run under test: its roles started, restarted and stopped as Slurm and the supervisors would,
what the soak observed meanwhile, and the kills it counted (per role and phase).

Guarantees: a role that exits is started again on the same run directory (a requeue) while the soak
is not paused; the whole-run stop SIGTERMs every role and SIGKILLs what is left after 60 s (a time
limit), and the resume starts them all again with ``control/STOP`` removed (a new allocation: a new
fencing generation); the drain at the end writes ``control/STOP`` and times each role's exit after
the trainer's.
"""

from __future__ import annotations

import json
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc.paths import RunPaths
from scripts.chaos.client import SERVICE_TIMEOUT_S
from scripts.chaos.observe import MetricsTail, Reloads, Waits, Zombies, infer_servers, ready_shards
from scripts.chaos.procs import Role, now

if TYPE_CHECKING:
    from scripts.chaos.client import ProcessClient

SPOOLRL = [sys.executable, "-m", "hpc.cli"]
ROLES = ("infer", "trainer", "rollout", "raas")
KILL_NAME = {"infer": "infer-server"}  # the infer role's kills hit its engine process; the node restarts it
RUNDOWN_BOUND_S = 60.0
STOP_GRACE_S = 60.0  # SIGTERM, then SIGKILL: a time limit's KillWait
# the rollout-server beside the run has a secret of its own: it reaches the run's inference server as a
# trusted-network client would (weight reloads still need the run's secret)
SOAK_OVERRIDES = ["run.name=soak", "trainer.checkpoint_every=2", "inference.require_auth_all=false"]
RAAS_OVERRIDES = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "spool.poll_interval_s=0.2",
                  "spool.heartbeat_interval_s=1", "spool.shard_max_trajectories=1", "spool.lease_s=30",
                  "rollout.run_workers=2", "rollout.init_workers=1", "rollout.eval_workers=1",
                  "inference.max_retries=1", "rollout.max_retries=1", f"service.timeout_s={SERVICE_TIMEOUT_S}"]


def unkilled_roles(kills: dict[str, dict[str, int]]) -> list[str]:
    """The roles (names of ROLES) with no kill in ``kills`` (kill name -> phase -> count, as
    :meth:`Harness.kills_by_role` gives them): what the scheduler still owes and the chaos check fails on."""
    return [r for r in ROLES if not sum(kills.get(KILL_NAME.get(r, r), {}).values())]


class Harness:
    """The run, its roles, the trainer's fault plan, the kills and what the observers saw."""

    def __init__(self, out: Path, seed: int) -> None:
        self.out, self.rng = out, random.Random(seed)
        self.run = RunPaths(out / "run")
        self.raas = out / "raas"
        self.kills: Counter[tuple[str, str]] = Counter()
        self.killed_pids: set[int] = set()  # the processes the chaos SIGKILLed (a role's, or an engine's)
        self.killed_after_grace: list[str] = []  # roles the whole-run stop SIGKILLed: SIGTERM did not end them
        self.events: list[dict[str, Any]] = []
        self.roles: dict[str, Role] = {}
        self.fault_plan: list[str] = []
        self.paused = False
        self.resumes = 0
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
        print(json.dumps({"soak": "event", **rec}, default=str), flush=True)

    def count_kill(self, role: str, phase: str, pid: int | None = None, **fields: Any) -> None:
        """Count a SIGKILL the chaos dealt; ``pid`` (when known) is the process it killed."""
        self.kills[(role, phase)] += 1
        if pid is not None:
            self.killed_pids.add(pid)
        self.event("kill", role=role, phase=phase, pid=pid, **fields)

    def unkilled(self) -> list[str]:
        """The roles (names of ROLES) the soak has not SIGKILLed yet."""
        return unkilled_roles(self.kills_by_role())

    def kills_by_role(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (role, phase), n in sorted(self.kills.items()):
            out.setdefault(role, {})[phase] = n
        return out

    # --- starting and restarting ------------------------------------------------------------------------

    def trainer_env(self) -> dict[str, str]:
        """Some incarnations SIGKILL themselves mid-checkpoint or mid-publish (train_node.trainer.faults)."""
        fault = self.fault_plan.pop(0) if self.fault_plan else ""
        return {"SPOOLRL_FAULT": fault, "OMP_NUM_THREADS": "1"}

    def start_role(self, name: str) -> None:
        role = self.roles[name]
        env = self.trainer_env() if name == "trainer" else {}
        role.start(env)
        fault = {"fault": env["SPOOLRL_FAULT"]} if env.get("SPOOLRL_FAULT") else {}
        self.event("start", role=name, incarnation=role.starts, **fault)

    def supervise(self) -> None:
        """Restart every role that died (a requeue, or the supervisor); count self-inflicted trainer kills."""
        if not self.paused:
            for name in self.roles:
                self.supervise_one(name)

    def supervise_one(self, name: str) -> None:
        role = self.roles[name]
        if role.proc is None or role.alive():
            return
        point = role.env.get("SPOOLRL_FAULT", "").split(":")[0]
        if role.killed:
            pass  # counted when the soak killed it
        elif name == "trainer" and role.proc.returncode == -signal.SIGKILL and point:
            self.count_kill("trainer", point, how="fault point", pid=role.proc.pid)
        else:
            self.event("exited", role=name, code=role.proc.returncode)
        self.start_role(name)

    # --- observation (every second) -----------------------------------------------------------------------

    def observe(self) -> None:
        t = now()
        if t - self._observed < 1.0:
            return
        self._observed = t
        self.reloads.observe(infer_servers(self.run), t)
        self.waits.observe(self.trainer_started(), ready_shards(self.run), t)
        self.zombies.observe([pid for r in self.roles.values() if (pid := r.pid()) is not None], t)

    def all_alive(self) -> bool:
        return all(r.alive() for r in self.roles.values())

    def trainer_started(self) -> bool:
        """The current trainer incarnation is alive and logged ``trainer_start`` (setup done)."""
        role = self.roles["trainer"]
        if not role.alive():
            return False
        wall_start = time.time() - (now() - role.started)
        return any(r["t"] >= wall_start for r in self.metrics.of("trainer_start"))

    def wait_for(self, predicate: Callable[[], bool], limit_s: float, poll_s: float = 0.2) -> bool:
        """Poll ``predicate`` every ``poll_s`` for up to ``limit_s``, observing and supervising meanwhile."""
        deadline = now() + limit_s
        while now() < deadline:
            if predicate():
                return True
            self.observe()
            self.supervise()
            time.sleep(poll_s)
        return False

    # --- whole-run stop and resume (a new allocation) -------------------------------------------------------

    def stop_all(self, why: str) -> None:
        """SIGTERM every role (as at a time limit), SIGKILL what is left after STOP_GRACE_S."""
        self.paused = True
        for role in self.roles.values():
            role.signal_group(signal.SIGTERM)
        deadline = now() + STOP_GRACE_S
        while any(r.alive() for r in self.roles.values()) and now() < deadline:
            self.observe()
            time.sleep(0.5)
        late = [name for name, r in self.roles.items() if r.alive()]
        self.killed_after_grace += late
        for name in late:
            self.roles[name].signal_group(signal.SIGKILL)
        for role in self.roles.values():
            role.reap()
        self.event("run_stopped", why=why, killed_after_grace=late)

    def resume_all(self) -> None:
        self.run.stop_marker.unlink(missing_ok=True)
        for name in ROLES:
            self.start_role(name)
        self.paused = False
        self.resumes += 1
        self.event("run_resumed")

    def kill_everything(self) -> None:
        for role in self.roles.values():
            role.signal_group(signal.SIGKILL)


def prepare(out: Path, seed: int) -> Harness:
    """A new run directory with the demo's config, its roles defined (none started)."""
    from hpc.cli.demo_run import check_sandbox, demo_config
    from hpc.cli.run import init_run

    if (out / "run" / "run.yaml").exists():
        raise SystemExit(f"soak: {out} already holds a soak; pass a new --out")
    config = demo_config(100000, [*SOAK_OVERRIDES, f"sandbox.scratch_dir={out / 'scratch'}"])
    check_sandbox(config)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    h = Harness(out, seed)
    init_run(str(h.run.root), config)
    run = str(h.run.root)
    h.role("infer", [*SPOOLRL, "infer-node", run])
    h.role("trainer", [*SPOOLRL, "train-node", run])
    h.role("rollout", [*SPOOLRL, "rollout-node", run, "--node-id", "soak-n1"])
    h.role("raas", [*SPOOLRL, "rollout-server", "--run", str(h.raas), "--host", "127.0.0.1", "--port", "0",
                    f"model.path={config.model.path}", f"sandbox.scratch_dir={out / 'scratch-raas'}", *RAAS_OVERRIDES])
    return h


def run_down(h: Harness, client: ProcessClient) -> dict[str, Any]:
    """Drain: STOP for the run, SIGTERM for the rollout-server; times each role's exit after the trainer's."""
    client.stopping.set()
    client.thread.join(SERVICE_TIMEOUT_S + 90)
    h.fault_plan = []  # a trainer requeued now drains cleanly
    h.run.stop_marker.write_text("soak finished\n")
    h.roles["raas"].signal_group(signal.SIGTERM)
    h.event("stop")
    trainer_end = wait_trainer_done(h)
    others = [r for r in h.roles.values() if r.name != "trainer"]
    while now() < trainer_end + RUNDOWN_BOUND_S + 30 and any(r.alive() for r in others):
        for r in others:
            if r.ended_at is None and not r.alive():
                r.ended_at = now()
        h.observe()
        time.sleep(0.5)
    outlived = {r.name: round((r.ended_at or now()) - trainer_end, 1) for r in others}
    for r in others:
        r.signal_group(signal.SIGKILL)
        r.reap()
    h.reloads.close_all(now(), "server stopped")
    trainer = h.roles["trainer"].proc
    return {"trainer_exit": trainer.returncode if trainer else None, "after_trainer_s": outlived}


def wait_trainer_done(h: Harness, limit_s: float = 900.0) -> float:
    """Requeue the trainer until an incarnation exits 0 (or ``limit_s`` passes); when it ended."""
    deadline = now() + limit_s
    trainer = h.roles["trainer"]
    while now() < deadline and not (trainer.proc is not None and trainer.proc.poll() == 0):
        h.observe()
        if not trainer.alive():
            h.supervise_one("trainer")
        time.sleep(0.5)
    return now()
