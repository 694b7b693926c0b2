"""The chaos: when each role is SIGKILLed, and the moment chosen so that the kill lands in a phase.

Kill moments and targets are drawn from the seed (each role at least once, about one kill per
``KILL_EVERY_S``); the first kill of a role, and half of the later ones, wait for its phase:

- rollout node (process group): an EVAL running in one of its sandboxes -> phase ``eval``;
- inference server (the engine process, ``server_pid``): a weight reload in progress, seen as
  ``loading`` in its endpoint record (polled every 20 ms; the infer-node writes it before it pushes
  the weights) -> phase ``reload`` when the record still shows that reload right after the kill
  (the push had not finished), else ``serving``;
- rollout-server (process group): a ``/process`` call in flight -> phase ``call``;
- trainer (process group): from outside at a random instant (phase ``any``); besides, trainer
  incarnations start with ``SPOOLRL_FAULT=checkpoint:1`` or ``publish:N`` (:func:`fault_plan`) and
  SIGKILL themselves half-way through writing a checkpoint or a policy version (phases
  ``checkpoint`` and ``publish``, counted by the harness when it requeues them).

A wait that finds no phase in time kills anyway (phase ``any``, or ``serving``); no wait runs past
the window's end (by more than a second). Once per soak, at a drawn moment, the whole run is stopped and resumed.
What a long phase wait pushed past the window still happens right after it: a kill of each role not killed
yet (no phase wait) and the whole-run stop and resume, so every soak kills each role and resumes once.
"""

from __future__ import annotations

import os
import random
import signal
import time

from scripts.chaos.client import ProcessClient
from scripts.chaos.harness import ROLES, Harness
from scripts.chaos.observe import InferServer, infer_servers
from scripts.chaos.procs import descendants, now, process_table

KILL_EVERY_S = 90.0
PHASE_WAIT_S = 30.0  # EVALs and /process calls come every few seconds
RELOAD_WAIT_S = 150.0  # a reload follows each published step (about a minute apart on a loaded 2-core host)
FAST_POLL_S = 0.02  # a reload of the tiny model takes 0.1-0.6 s


def kill_plan(rng: random.Random, window_s: float) -> list[tuple[float, str]]:
    """(seconds into the window, role) of every kill: each role at least once, then at random."""
    n = max(len(ROLES), int(window_s // KILL_EVERY_S))
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


class Chaos:
    """Kills one role at a time, each in the phase its draw asks for when that phase comes in time."""

    def __init__(self, h: Harness, client: ProcessClient, window_end: float) -> None:
        self.h, self.client, self.window_end = h, client, window_end
        self.killed_before: set[str] = set()

    def kill(self, target: str) -> None:
        in_phase = target not in self.killed_before or self.h.rng.random() < 0.5
        self.kill_in(target, in_phase)

    def kill_in(self, target: str, in_phase: bool) -> None:
        self.killed_before.add(target)
        if target == "infer":
            self.kill_infer_server(in_phase)
            return
        phase = self.wait_phase(target) if in_phase else "any"
        role = self.h.roles[target]
        pid = role.pid()
        if pid is not None:
            role.signal_group(signal.SIGKILL)
            self.h.count_kill(target, phase, pid=pid)

    def wait_phase(self, target: str) -> str:
        limit = self.limit(PHASE_WAIT_S)
        if target == "rollout" and self.h.wait_for(lambda: bool(self.eval_pids()), limit):
            return "eval"
        if target == "raas" and self.h.wait_for(lambda: self.client.in_flight, limit):
            return "call"
        return "any"

    def limit(self, want_s: float) -> float:
        return max(1.0, min(want_s, self.window_end - now()))

    def eval_pids(self) -> list[int]:
        """Processes of the rollout node running an EVAL's tests (EVAL alone runs ``env -i PATH=...``
        inside its sandbox: rollout_node.tasks.harness.build_test_argv)."""
        pid = self.h.roles["rollout"].pid()
        if pid is None:
            return []
        tree = process_table()
        return [p for p in descendants(tree, pid) if " env -i PATH=" in tree[p].cmdline]

    # --- the inference server ----------------------------------------------------------------------------

    def kill_infer_server(self, mid_reload: bool) -> None:
        server = self.reload_in_progress() if mid_reload else None
        if server is None:
            server = next((s for s in infer_servers(self.h.run) if s.server_pid), None)
        if server is None or server.server_pid is None:
            self.h.event("kill_skipped", role="infer-server", why="no server announced")
            return
        try:
            os.kill(server.server_pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        phase = "reload" if server.loading is not None and self.still_loading(server) else "serving"
        self.h.count_kill("infer-server", phase, version=server.loading, pid=server.server_pid)

    def reload_in_progress(self) -> InferServer | None:
        """Wait (polling every FAST_POLL_S) for a server to show a reload in progress; it, or None."""
        seen: list[InferServer] = []

        def loading() -> bool:
            seen[:] = infer_servers(self.h.run)
            return any(s.loading is not None and s.server_pid for s in seen)
        if not self.h.wait_for(loading, self.limit(RELOAD_WAIT_S), FAST_POLL_S):
            return None
        self.h.reloads.observe(seen, now())  # the reload's start, as the fast poll saw it
        return next(s for s in seen if s.loading is not None and s.server_pid)

    def still_loading(self, server: InferServer) -> bool:
        """The killed server's record still names the reload: the push had not finished."""
        return any(s.key == server.key and s.loading == server.loading for s in infer_servers(self.h.run))


def run_chaos(h: Harness, client: ProcessClient, window_s: float) -> None:
    """The window: supervise, kill on schedule, stop and resume the whole run once."""
    h.fault_plan = fault_plan(h.rng, window_s)
    for name in ROLES:
        h.start_role(name)
    if not h.wait_for(h.trainer_started, 900.0):
        raise SystemExit("soak: the trainer did not start within 900 s; see " + str(h.out / "logs"))
    start = now()
    plan = kill_plan(h.rng, window_s)
    resume_s = h.rng.uniform(0.35, 0.65) * window_s
    h.event("chaos", window_s=window_s, kills=[[round(t), r] for t, r in plan], resume_at=round(resume_s))
    resume_at: float | None = resume_s
    chaos = Chaos(h, client, start + window_s)
    while (elapsed := now() - start) < window_s:
        h.observe()
        h.supervise()
        if plan and elapsed >= plan[0][0]:
            chaos.kill(plan.pop(0)[1])
        elif resume_at is not None and elapsed >= resume_at:
            resume_at = None
            h.stop_all("once per soak: a new allocation")
            h.resume_all()
        time.sleep(0.5)
    finish_chaos(h, chaos, resume_pending=resume_at is not None)


def finish_chaos(h: Harness, chaos: Chaos, resume_pending: bool) -> None:
    """After the window, what a phase wait pushed past it: each role not killed yet is killed at once (no phase
    wait) and comes back; the whole-run stop and resume if its moment was missed."""
    for target in h.unkilled():
        h.event("late_kill", role=target, why="a phase wait ran past this kill's moment")
        chaos.kill_in(target, in_phase=False)
        h.wait_for(h.all_alive, 60.0)
    if resume_pending:
        h.stop_all("once per soak: a new allocation (after the window: a phase wait ran past its moment)")
        h.resume_all()
