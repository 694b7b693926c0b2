"""The python tool's server: a persistent interpreter that runs INSIDE the sandbox.

Standard library only (works with any python3 >= 3.6 in any image); the node passes this file's
text as ``python3 -c SOURCE SOCKET TOKEN KEEP_BYTES``. Protocol: the server *connects* to the
node's listening Unix socket (so the node never follows a path the agent controls), sends a
hello frame ``{"token", "pid"}``, then answers request frames ``{"code", "timeout_s"}`` with
``{"output", "exit_code", "timed_out", "truncated", "total_bytes"}``. A frame is a 4-byte
big-endian length and UTF-8 JSON.

Guarantees: globals persist between calls (like a notebook kernel); the value of a trailing
expression is printed (repr); exceptions print a traceback and give exit_code 1; ``sys.exit(n)``
gives exit_code n without stopping the server; past ``timeout_s`` a ``ToolTimeout``
(a BaseException, so ``except Exception`` cannot swallow it) is raised in the user's code.
Output written by child processes straight to file descriptors 1/2 is not captured.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import struct
import sys
import traceback


class ToolTimeout(BaseException):
    pass


class Capture:
    """File-like object keeping the first and last ``keep`` bytes of what is written."""

    def __init__(self, keep: int) -> None:
        self.keep, self.head, self.tail, self.total = keep, bytearray(), bytearray(), 0

    def write(self, text: str) -> int:
        data = str(text).encode("utf-8", "replace")
        self.total += len(data)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > 2 * self.keep:
            del self.tail[: len(self.tail) - self.keep]
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def result(self) -> tuple[str, bool]:
        tail = bytes(self.tail[-self.keep:])
        dropped = self.total - len(self.head) - len(tail)
        middle = f"\n...[{dropped} bytes truncated]...\n".encode() if dropped > 0 else b""
        return (bytes(self.head) + middle + tail).decode("utf-8", "replace"), dropped > 0


def _on_alarm(signum: int, frame: object) -> None:
    raise ToolTimeout("timed out")


def run_code(code: str, namespace: dict, out: Capture) -> int:
    """Execute like a notebook cell; returns the exit code (0 ok, 1 exception, n for sys.exit(n))."""
    try:
        tree = ast.parse(code, "<python-tool>", "exec")
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.Expr):
            tree.body.pop()
        exec(compile(tree, "<python-tool>", "exec"), namespace)
        if isinstance(last, ast.Expr):
            value = eval(compile(ast.Expression(last.value), "<python-tool>", "eval"), namespace)
            if value is not None:
                out.write(repr(value) + "\n")
        return 0
    except SystemExit as exc:
        code_ = exc.code
        if code_ is None:
            return 0
        if isinstance(code_, int):
            return code_
        out.write(str(code_) + "\n")
        return 1
    except ToolTimeout:
        out.write("TimeoutError: the python tool call timed out\n")
        return 124
    except BaseException:  # the agent's error is data, never the server's death
        out.write(traceback.format_exc())
        return 1


def handle(request: dict, namespace: dict, keep: int) -> dict:
    out = Capture(keep)
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out  # type: ignore[assignment]
    timeout = float(request.get("timeout_s") or 0)
    timed_out = False
    try:
        if timeout > 0:
            signal.setitimer(signal.ITIMER_REAL, timeout)
        code = run_code(str(request.get("code", "")), namespace, out)
        timed_out = code == 124
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.stdout, sys.stderr = saved
    text, truncated = out.result()
    return {"output": text, "exit_code": code, "timed_out": timed_out, "truncated": truncated,
            "total_bytes": out.total}


def recv_frame(sock: socket.socket) -> dict | None:
    header = _recv_exact(sock, 4)
    if header is None:
        return None
    body = _recv_exact(sock, struct.unpack(">I", header)[0])
    return None if body is None else json.loads(body.decode("utf-8"))


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def send_frame(sock: socket.socket, obj: dict) -> None:
    body = json.dumps(obj).encode("utf-8")
    sock.sendall(struct.pack(">I", len(body)) + body)


def main(argv: list) -> int:
    path, token, keep = argv[1], argv[2], int(argv[3])
    os.setsid()  # out of the shell's session: Ctrl-C and terminal hangups never reach the kernel
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if path.startswith("tcp:"):  # only for scripts/bench_tools.py's UDS-vs-TCP comparison
        host, port = path[4:].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
    send_frame(sock, {"token": token, "pid": os.getpid()})
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    while True:
        request = recv_frame(sock)
        if request is None:
            return 0
        send_frame(sock, handle(request, namespace, keep))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
