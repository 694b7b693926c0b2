"""Node side of the python tool: a Unix socket in the episode's work dir, a start FIFO, framing.

Guarantees:
- The node only ever *listens*: it binds ``<workdir>/.spoolrl/py.sock`` through a directory file
  descriptor it opened before the sandbox started (``/proc/self/fd/N/py.sock``: short, so the
  107-byte ``sun_path`` limit never bites, and immune to the agent swapping ``.spoolrl`` for a
  symlink). The server inside connects to ``/work/.spoolrl/py.sock``. The node never opens or
  connects to a path the agent could have replaced, so a hostile agent cannot make the node
  touch host files or host sockets.
- The server is started lazily (first call) and restarted after it died, by writing a one-time
  token into a FIFO the sandbox's boot script listens on; only a connection that presents the
  token is served. State loss (restart) is reported in the result.
- :meth:`PyChannel.call` never raises for what the code does: timeouts (the server interrupts
  the code; if it does not answer within a grace period the node SIGKILLs it), crashes and
  kills of the server become results.
- Nothing the agent does to the tool makes the node raise (issue 13: the agent's outcome, never an
  infrastructure fault): a server patched or replaced from inside may answer anything (wrong
  types, deep nesting, NaN, huge numbers, garbage, oversized frames): its reply is coerced to a
  result or reported as a dead interpreter; a control directory removed, moved or made
  inaccessible from inside makes the tool unavailable for the rest of the episode (each call says
  so) while the shell goes on. Only a failure the agent cannot cause raises SandboxError.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shlex
import signal
import socket
import stat
import struct
import time
from collections.abc import Callable
from pathlib import Path

from hpc.errors import SandboxError
from rollout_node.sandbox.result import ToolResult, error_result

START_TIMEOUT_S = 20.0   # python start inside a sandbox on a loaded node
GRACE_S = 3.0            # after the server-side timeout, how long to wait before SIGKILL
MAX_FRAME = 64 * 2**20
MAX_REPLY_DEPTH = 32     # a reply nested deeper is garbage (json would recurse on the node)
MAX_EXIT_CODE = 2**31
SERVER_SOURCE = (Path(__file__).with_name("pyserver.py")).read_text()


class PyChannel:
    """One episode's python tool endpoint. ``ctl_fd`` is an open fd of the host's ``.spoolrl`` dir."""

    def __init__(self, ctl_fd: int, keep: int, in_sandbox: Callable[[int], bool]) -> None:
        self.ctl_fd, self.keep, self._in_sandbox = ctl_fd, keep, in_sandbox
        self.listener: socket.socket | None = None
        self.fifo_fd: int | None = None
        self.conn: socket.socket | None = None
        self.server_pid = 0
        self.starts = 0
        self._lost = ""
        self.unavailable = ""  # why the tool is off for the rest of the episode (control dir tampered with)

    def setup(self) -> None:
        """(Re)create the FIFO and the listening socket; called before each sandbox (re)start.

        A control directory the agent removed or made unusable turns the tool off (``unavailable``)
        instead of raising; any other failure raises SandboxError."""
        self.teardown()
        if self.unavailable:
            return
        try:
            self._create_endpoints()
        except OSError as exc:
            self.teardown()
            why = ctl_tampered(self.ctl_fd)
            if not why:
                raise SandboxError(f"python tool: cannot create its control files: {exc}") from exc
            self.unavailable = f"{why} from inside the sandbox, so the python tool is off for this episode"

    def _create_endpoints(self) -> None:
        for name in ("py.ctl", "py.sock"):
            try:
                os.unlink(name, dir_fd=self.ctl_fd)
            except FileNotFoundError:
                pass
        os.mkfifo("py.ctl", 0o600, dir_fd=self.ctl_fd)
        self.fifo_fd = os.open("py.ctl", os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=self.ctl_fd)
        if not stat.S_ISFIFO(os.fstat(self.fifo_fd).st_mode):
            raise OSError("py.ctl is not a FIFO")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(f"/proc/self/fd/{self.ctl_fd}/py.sock")
        self.listener.listen(8)

    def teardown(self) -> None:
        self._drop("")
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self.fifo_fd is not None:
            os.close(self.fifo_fd)
            self.fifo_fd = None

    def sandbox_restarted(self) -> None:
        if self.conn is not None:
            self._drop("the sandbox was restarted, so the python interpreter was restarted (state lost)")

    @staticmethod
    def boot_snippet(ctl_inside: str, keep: int) -> str:
        """Shell code (bash) that serves start requests; expects the server source in $1."""
        fifo, sock = shlex.quote(f"{ctl_inside}/py.ctl"), shlex.quote(f"{ctl_inside}/py.sock")
        return (f"( trap '' INT HUP; while [ -p {fifo} ] && read -r tok < {fifo}; do "
                f'python3 -c "$1" {sock} "$tok" {keep}; done ) </dev/null >/dev/null 2>&1 &')

    # ---------------------------------------------------------------- calls
    def call(self, code: str, timeout_s: float) -> ToolResult:
        t0 = time.monotonic()
        note = ""
        if self.unavailable:
            return error_result(f"python tool unavailable: {self.unavailable}", 0.0)
        if self.conn is None:
            note = self._lost
            self._lost = ""
            why = self._start()
            if why:
                return error_result(f"python tool unavailable: {why}", time.monotonic() - t0)
        assert self.conn is not None
        try:
            self._send({"code": code, "timeout_s": timeout_s})
            reply = self._recv(t0 + timeout_s + GRACE_S)
        except TimeoutError:
            self._kill_server()
            self._drop("")
            return self._result({"output": "", "exit_code": None, "timed_out": True}, t0,
                                "the code did not stop after its timeout: the interpreter was killed "
                                "and will restart on the next call (state lost)")
        except (OSError, ValueError, EOFError, RecursionError):
            self._drop("")
            return self._result({"output": "", "exit_code": None}, t0,
                                "the python interpreter died (killed or crashed); it restarts on the next "
                                "call (state lost)")
        return self._result(reply, t0, note)

    def _result(self, reply: dict, t0: float, note: str) -> ToolResult:
        """The reply as a result, whatever its fields hold (a patched server may send anything)."""
        out = reply.get("output", "")
        text = out if isinstance(out, str) else ""
        text = text[-2 * self.keep:] if len(text) > 2 * self.keep else text
        if note:
            text += ("" if not text or text.endswith("\n") else "\n") + f"[spoolrl: {note}]\n"
        code, total = reply.get("exit_code"), reply.get("total_bytes")
        return ToolResult(output=text, exit_code=_small_int(code, MAX_EXIT_CODE),
                          timed_out=reply.get("timed_out") is True, truncated=reply.get("truncated") is True,
                          duration_s=round(time.monotonic() - t0, 6),
                          total_bytes=_small_int(total, MAX_FRAME) or len(text.encode()))

    def _start(self) -> str:
        if self.listener is None or self.fifo_fd is None:
            return "the sandbox is closed"
        token = secrets.token_hex(16)
        try:
            os.write(self.fifo_fd, token.encode() + b"\n")
        except BlockingIOError:
            return "the start channel is jammed (the sandbox's .spoolrl/py.ctl was tampered with)"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not select.select([self.listener], [], [], max(0.0, deadline - time.monotonic()))[0]:
                break
            conn, _ = self.listener.accept()
            if self._handshake(conn, token):
                self.starts += 1
                return ""
            conn.close()
        return (f"the interpreter did not connect within {START_TIMEOUT_S:.0f} s (no python3 in the image, "
                "or the sandbox's start loop was killed)")

    def _handshake(self, conn: socket.socket, token: str) -> bool:
        self.conn = conn
        try:
            hello = self._recv(time.monotonic() + 5.0)
        except (OSError, ValueError, EOFError, TimeoutError):
            hello = {}
        if hello.get("token") != token:
            self.conn = None
            return False
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        self.server_pid = struct.unpack("3i", creds)[0]
        return True

    def _kill_server(self) -> None:
        if self.server_pid and self._in_sandbox(self.server_pid):
            try:
                os.kill(self.server_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _drop(self, lost: str) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
            self._lost = lost
        self.server_pid = 0

    def _send(self, obj: dict) -> None:
        assert self.conn is not None
        body = json.dumps(obj).encode()
        self.conn.settimeout(10.0)
        self.conn.sendall(struct.pack(">I", len(body)) + body)

    def _recv(self, deadline: float) -> dict:
        header = self._recv_exact(4, deadline)
        size = struct.unpack(">I", header)[0]
        if size > MAX_FRAME:
            raise ValueError(f"frame of {size} bytes")
        body = self._recv_exact(size, deadline)
        if _nesting(body) > MAX_REPLY_DEPTH:
            raise ValueError("reply nested too deeply")
        reply = json.loads(body)
        if not isinstance(reply, dict):
            raise ValueError("not an object")
        return reply

    def _recv_exact(self, n: int, deadline: float) -> bytes:
        assert self.conn is not None
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.conn.settimeout(left)
            chunk = self.conn.recv(n - len(buf))  # socket.timeout is TimeoutError
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)


def _small_int(value: object, bound: int) -> int | None:
    """``value`` if it is an int (not a bool) within +-``bound``, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and -bound <= value <= bound:
        return value
    return None


def _nesting(body: bytes) -> int:
    """An upper bound of the JSON nesting of ``body`` (brackets inside strings count too: fine for a bound)."""
    depth = deepest = 0
    for ch in body.translate(None, _NOT_BRACKETS):
        depth += 1 if ch in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def ctl_tampered(ctl_fd: int) -> str:
    """Why the control directory behind ``ctl_fd`` is no longer usable by the node ('' if it is)."""
    try:
        st = os.fstat(ctl_fd)
    except OSError:
        return ""
    if st.st_nlink == 0:
        return "the control directory /work/.spoolrl was removed"
    if stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
        return "the control directory /work/.spoolrl was made inaccessible"
    return ""
