"""Processes as the soak sees them: a role it starts, SIGKILLs and starts again (what Slurm and the
node supervisors do), and a ``/proc`` table for the zombie and leak checks.

Guarantees: every role runs in a session of its own (``start_new_session``), so a kill of its group
takes its whole tree; ``Role.killed`` says whether the soak SIGKILLed the current incarnation.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollout_node.sandbox import limits

ROOT = Path(__file__).resolve().parents[2]


def now() -> float:
    return time.monotonic()


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

    def pid(self) -> int | None:
        return self.proc.pid if self.alive() and self.proc is not None else None

    def signal_group(self, signum: int) -> None:
        if self.proc is None:
            return
        self.killed = self.killed or signum == signal.SIGKILL
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def reap(self) -> None:
        if self.proc is not None:
            self.proc.wait()


@dataclass(frozen=True)
class Proc:
    ppid: int
    state: str
    start: str  # start time in clock ticks: (pid, start) names one process even across pid reuse
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
    """Every process under ``root`` (not ``root`` itself)."""
    return [p for p in limits.descendants([root], {pid: p.ppid for pid, p in tree.items()}) if p != root]


def ancestors(pid: int) -> list[int]:
    tree, out = process_table(), []
    while pid in tree and pid > 1:
        pid = tree[pid].ppid
        out.append(pid)
    return out
