"""A server does not outlive its node: SIGKILL the process that started it and the server ends too.

The node is a real Python process that starts a CPU server through the production handle
(``CpuServer``, own session, ``setpriv --pdeathsig``) and is then killed with SIGKILL, which no handler
can see; the server must be gone soon after (it is not in the node's process group, so only the
tether can end it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

NODE = """
import sys, time
from pathlib import Path
from train_node.infer.servers import CpuServer, ServerSpec
tmp = Path(sys.argv[2])
(tmp / "secret").write_text("s" * 32 + "\\n")
spec = ServerSpec(index=0, bind_host="127.0.0.1", advertise_host="127.0.0.1", port=0, secret_file=tmp / "secret",
                  log_path=tmp / "server.log", threads=1, max_batch=4, dtype="float32")
server = CpuServer(spec)
server.start(Path(sys.argv[1]), 0)
print(server.pid, flush=True)
deadline = time.monotonic() + 180
while not server.healthy() and time.monotonic() < deadline:
    time.sleep(0.2)
print("healthy" if server.healthy() else "not healthy", flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_server_dies_with_its_node(models: dict[str, Path], tmp_path: Path) -> None:
    node = subprocess.Popen([sys.executable, "-c", NODE, str(models["a"]), str(tmp_path)], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    server_pid = 0
    try:
        assert node.stdout is not None
        server_pid = int(node.stdout.readline())
        assert node.stdout.readline().strip() == "healthy", (tmp_path / "server.log").read_text()[-2000:]
        assert os.getsid(server_pid) != os.getsid(node.pid), "the server has its own session"
        node.kill()  # SIGKILL: the node runs no cleanup at all
        node.wait(30)
        deadline = time.monotonic() + 60
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(server_pid), "the server outlived its node"
    finally:
        if node.poll() is None:
            node.kill()
        if server_pid and _alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
