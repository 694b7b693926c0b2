"""The agent's bash: one persistent interactive shell driven through a pseudo-terminal.

Who holds the PTY: the node does. The node opens the PTY and starts the sandbox runtime on its
slave side; bash inside the sandbox inherits it as its controlling terminal. The alternative - a
helper process inside the sandbox that owns the PTY and talks to the node over a Unix socket -
was measured side by side with ``scripts/bench_tools.py --only holder`` (bwrap, same commands,
loaded 2-core machine): cold start 20.9 ms (node) vs 50.5 ms (helper), median action 2.5 ms vs
4.6 ms. The helper must start python before bash can run (every cold start pays it), adds a socket
hop and a python loop to every action, and needs python in the image even for bash-only tasks.
A dead shell costs a new sandbox either way.

Spawning: ``os.openpty`` + ``setsid --ctty`` + ``subprocess.Popen`` without ``preexec_fn``, so
CPython uses vfork (0.3 ms per spawn measured here) instead of ptyprocess's full fork of the
node process (105 ms per ``PtyProcess.spawn(["true"])`` in the same micro-benchmark), which also
freezes every other thread of the node while it copies the page tables.

Completion: bash runs with ``--norc --noprofile --noediting -i`` (no readline, so no echo or
bracketed-paste noise), the terminal has ECHO and ONLCR off, PS1/PS2 are empty and
``PROMPT_COMMAND`` prints ``\\x1e<nonce>:<status>\\x1e`` before each prompt. The nonce is random
per shell, so program output cannot produce the marker by accident. Each command is sent as one
``{ ...\\n}`` group so a multi-line command yields exactly one marker; commands longer than the
terminal's line limit travel encoded, up to ``framing.MAX_COMMAND_BYTES`` (see ``framing.py``).

Guarantees of :meth:`PtyShell.run` (never raises for anything the command does):
- past ``timeout_s`` the foreground job gets Ctrl-C; if no prompt comes back within
  ``GRACE_S`` the whole sandbox is killed and a new one started (exit_code None);
- output beyond ``keep`` bytes is cut to head + tail with the total byte count; while output is
  being truncated the reader slows down, so a flood blocks its writer instead of a CPU;
- a shell that exits or is killed is detected (EOF on the PTY) and respawned; the result says so;
- cwd and environment persist between calls of one shell;
- a command runs exactly as given or not at all: past ``framing.MAX_COMMAND_BYTES`` (or with a NUL
  byte) the result is an error note with exit_code None and nothing is sent.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import select
import shutil
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass

from hpc.errors import SandboxError
from rollout_node.sandbox import spawner
from rollout_node.sandbox.framing import CommandRefused, frame
from rollout_node.sandbox.limits import kill_tree
from rollout_node.sandbox.result import HeadTail, ToolResult, make_result

BASH_ARGS = ["bash", "--norc", "--noprofile", "--noediting", "-i"]
GRACE_S = 2.0          # after Ctrl-C, how long the job may take to give the prompt back
SPAWN_TIMEOUT_S = 30.0
READ_CHUNK = 1 << 20
SEND_CHUNK = 4096
FLOOD_PAUSE_S = 0.005  # pause between reads once output is being truncated (back-pressure)
SETSID = shutil.which("setsid") or "/usr/bin/setsid"  # util-linux


@dataclass(frozen=True)
class ShellLaunch:
    """How to start the sandboxed shell: the argv (runtime + boot script), env and cwd of the launcher."""

    argv: list[str]
    env: dict[str, str]
    cwd: str


class ShellDied(Exception):
    pass


def marker_env(nonce: str) -> dict[str, str]:
    """Variables that make the interactive bash print the completion marker and nothing else."""
    # bash ignores PS1/PS2 from the environment of an interactive shell, so PROMPT_COMMAND (which
    # it does take, and runs before each prompt) clears them after printing the status of $?.
    # An interactive bash catches SIGUSR1 even when it was ignored on entry (and dies of it): the
    # trap keeps the shell alive through Slurm's time-limit warning (see spawner.WARNING_SIGNAL).
    return {"PROMPT_COMMAND": f'printf "\\036{nonce}:%s\\036" $?; PS1=; PS2=; PS0=; '
                              f"trap '' {spawner.WARNING_SIGNAL}"}


def _open_pty(rows: int, cols: int) -> tuple[int, int]:
    """A PTY pair with ECHO and ONLCR off and the given window size (set before the child starts)."""
    master, slave = os.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.ONLCR                    # oflag: keep "\n" as is
    attrs[3] &= ~(termios.ECHO | termios.ECHONL)  # lflag: no echo of what the node types
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    return master, slave


class PtyShell:
    """A persistent bash in a sandbox. ``launch(nonce)`` builds how to start it (called on every spawn)."""

    def __init__(self, launch: Callable[[str], ShellLaunch], *, keep: int,
                 on_spawn: Callable[[int], None] | None = None, on_death: Callable[[int], None] | None = None,
                 why_dead: Callable[[int], str] = lambda pid: "", before_respawn: Callable[[], None] = lambda: None,
                 dimensions: tuple[int, int] = (50, 200)) -> None:
        self._launch, self.keep, self._dims = launch, keep, dimensions
        self._on_spawn, self._on_death = on_spawn, on_death
        self._why_dead = why_dead  # pid -> why the watchdog killed that shell ('' if it did not), cleared by reading
        # called before a shell the watchdog killed is started again (the sandbox's back-off and
        # the wait for its killed processes to be released)
        self._before_respawn = before_respawn
        self.proc: subprocess.Popen | None = None
        self.fd = -1
        self._carry = b""

    # -------------------------------------------------------------- lifecycle
    def spawn(self) -> float:
        """Start a fresh shell; returns the seconds until its first prompt. Raises SandboxError, naming
        the watchdog's verdict when the watchdog killed the shell as it started."""
        t0 = time.monotonic()
        nonce = secrets.token_hex(8)
        self._marker = re.compile(b"\x1e" + nonce.encode() + rb":(\d{1,3})\x1e")  # status <= 255: a forged huge one is output
        launch = self._launch(nonce)
        master, slave = _open_pty(*self._dims)
        # `setsid --ctty` makes the PTY the controlling terminal of a new session (Ctrl-C reaches the
        # foreground job; the session is also the sandbox's scheduler autogroup). No preexec_fn, so
        # subprocess can use vfork: a spawn costs well under a millisecond even from a big node process.
        # Signals the node ignores (nohup, `cmd &` in a script) are reset first (see spawner.py).
        argv = [*spawner.launcher_prefix(), SETSID, "--ctty", *launch.argv]
        try:
            self.proc = spawner.spawn(lambda: subprocess.Popen(
                argv, stdin=slave, stdout=slave, stderr=slave, env=launch.env, cwd=launch.cwd, close_fds=True))
        except OSError as exc:
            os.close(master)
            raise SandboxError(f"could not start the sandbox shell ({launch.argv[0]}): {exc}") from exc
        finally:
            os.close(slave)
        self.fd = master
        if self._on_spawn:
            self._on_spawn(self.proc.pid)
        buf = HeadTail(4096)
        try:
            self._read_until_marker(buf, t0 + SPAWN_TIMEOUT_S)
        except (ShellDied, TimeoutError) as exc:
            pid = self.proc.pid
            status = self.kill()
            why = self._why_dead(pid)
            raise SandboxError(f"the sandbox shell did not start (exit status {status}"
                               + (f"; {why}" if why else "") + f"): {buf.text().strip()[-2000:]!r}") from exc
        return time.monotonic() - t0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> int | None:
        """Kill the sandbox's whole process tree; returns the launcher's exit status if known."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        kill_tree([proc.pid])
        try:
            code = proc.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        os.close(self.fd)
        self.fd = -1
        if self._on_death:
            self._on_death(proc.pid)
        if code is None:
            return None
        return code if code >= 0 else 128 - code

    # -------------------------------------------------------------- commands
    def run(self, command: str, timeout_s: float) -> ToolResult:
        t0 = time.monotonic()
        buf = HeadTail(self.keep)
        note = ""
        if self.proc is None:
            self.spawn()
            note = "the shell had died; a new one was started (cwd and environment were reset)"
        assert self.proc is not None
        try:
            data = frame(command)
        except CommandRefused as exc:
            return make_result(buf, None, time.monotonic() - t0, note=str(exc))
        try:
            self._send(data, t0 + timeout_s)
            status = self._read_until_marker(buf, t0 + timeout_s)
            return make_result(buf, status, time.monotonic() - t0, note=note)
        except TimeoutError:
            return self._interrupt(buf, t0, note)
        except (ShellDied, OSError):
            return self._died(buf, t0, self._why_dead(self.proc.pid))

    def _send(self, data: bytes, deadline: float) -> None:
        """Type ``data`` into the shell without blocking past ``deadline`` (a long command fills the
        PTY's input buffer until bash reads it); output seen meanwhile is kept for the marker search."""
        fd = self.fd
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        try:
            while data:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                readable, writable, _ = select.select([fd], [fd], [], min(left, 1.0))
                if readable:
                    chunk = os.read(fd, READ_CHUNK)  # EIO (OSError) once the shell is gone
                    if not chunk:
                        raise ShellDied()
                    self._carry += chunk
                if writable:
                    try:
                        data = data[os.write(fd, data[:SEND_CHUNK]):]
                    except BlockingIOError:
                        continue
        finally:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)

    def _interrupt(self, buf: HeadTail, t0: float, note: str) -> ToolResult:
        assert self.proc is not None
        try:
            os.write(self.fd, b"\x03")
            status: int | None = self._read_until_marker(buf, time.monotonic() + GRACE_S)
        except (TimeoutError, ShellDied, OSError):
            self.kill()
            self.spawn()
            status = None
            note = "the command ignored Ctrl-C: the sandbox was killed and a new shell started (state reset)"
        return make_result(buf, status, time.monotonic() - t0, timed_out=True, note=note)

    def _died(self, buf: HeadTail, t0: float, why: str) -> ToolResult:
        status = self.kill()
        if why:
            status = None
            self._before_respawn()
        cause = why if why else f"the shell exited (status {status})"
        try:
            self.spawn()
            note = f"{cause}; a new shell was started (cwd, environment and /tmp were reset)"
        except SandboxError as exc:
            note = f"{cause}; it could not be restarted: {exc}"
        return make_result(buf, status, time.monotonic() - t0, note=note)

    def _read_until_marker(self, buf: HeadTail, deadline: float) -> int:
        assert self.proc is not None
        fd = self.fd
        pending = self._carry
        self._carry = b""
        while True:
            m = self._marker.search(pending)
            if m:
                buf.add(pending[: m.start()])
                self._carry = pending[m.end():]
                return int(m.group(1))
            # everything but a possible marker prefix is output
            cut = max(0, len(pending) - 40)
            if cut:
                buf.add(pending[:cut])
                pending = pending[cut:]
            left = deadline - time.monotonic()
            if left <= 0:
                buf.add(pending)
                raise TimeoutError
            if buf.total > 2 * self.keep:
                time.sleep(FLOOD_PAUSE_S)
            if not select.select([fd], [], [], min(left, 1.0))[0]:
                continue
            try:
                chunk = os.read(fd, READ_CHUNK)
            except OSError as exc:  # EIO: every slave end is closed (the shell is gone)
                buf.add(pending)
                raise ShellDied() from exc
            if not chunk:
                buf.add(pending)
                raise ShellDied()
            pending += chunk
