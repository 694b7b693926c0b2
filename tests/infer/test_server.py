"""``spoolrl serve`` as a real process: health only after load, Unix socket, kill mid-request, SIGTERM."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from train_node.infer.proxy import Upstream

REPO = Path(__file__).resolve().parents[2]


def _serve(model: Path, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "hpc.cli", "serve", "--model", str(model), "--threads", "1", *extra]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_file(path: Path, proc: subprocess.Popen[bytes], timeout_s: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return dict(json.loads(path.read_text()))
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "server exited"
        time.sleep(0.1)
    raise AssertionError(f"{path} did not appear")


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(30)


def test_health_only_after_load_then_killed_mid_request(models: dict[str, Path], tmp_path: Path) -> None:
    """/health is 200 only once the model loaded; a SIGKILL mid-request is a clean connection error."""
    import socket

    ready = tmp_path / "ready.json"
    with socket.socket() as s:  # a known port: the server's socket exists before its model does
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _serve(models["a"], "--port", str(port), "--ready-file", str(ready))
    seen: list[Any] = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not ready.exists():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    seen.append((r.status, time.time()))
            except urllib.error.HTTPError as e:
                seen.append((e.code, time.time()))
            except OSError:
                seen.append(("refused", time.time()))
            time.sleep(0.05)
        info = _wait_file(ready, proc)
        assert info["url"] == f"http://127.0.0.1:{port}" and info["pid"] == proc.pid
        # every 200 seen while polling came after the model had loaded: the ready file is written just
        # after the load, so a 200 may precede it by that write, never by the seconds a load takes
        loaded_at = ready.stat().st_mtime - 0.5
        assert all(t >= loaded_at for code, t in seen if code == 200), (loaded_at, seen)
        assert 503 in [code for code, _ in seen], f"never saw the loading state: {seen[:5]}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert r.status == 200
        _kill_mid_request(proc, f"127.0.0.1:{port}")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _kill_mid_request(proc: subprocess.Popen[bytes], hostport: str) -> None:
    outcome: dict[str, Any] = {}

    def long_request() -> None:
        conn = http.client.HTTPConnection(hostport, timeout=60)
        try:
            conn.request("POST", "/v1/completions", json.dumps({"prompt": [1, 2, 3], "max_tokens": 1500,
                                                                "ignore_eos": True}),
                         {"Content-Type": "application/json"})
            outcome["status"] = conn.getresponse().status
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            outcome["error"] = exc
        finally:
            conn.close()

    thread = threading.Thread(target=long_request)
    thread.start()
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGKILL)
    thread.join(30)
    assert not thread.is_alive(), "the client hung after the server died"
    assert "status" not in outcome and isinstance(outcome["error"], (ConnectionError, http.client.HTTPException))


def test_unix_socket_and_clean_sigterm(models: dict[str, Path], tmp_path: Path) -> None:
    sock = tmp_path / "s.sock"
    ready = tmp_path / "ready.json"
    proc = _serve(models["a"], "--uds", str(sock), "--ready-file", str(ready))
    try:
        info = _wait_file(ready, proc)
        assert info["url"] == f"unix://{sock}"
        assert oct(sock.stat().st_mode & 0o777) == "0o600"
        out = Upstream(info["url"]).json("POST", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 5,
                                                                     "return_token_ids": True, "ignore_eos": True})
        assert len(out["choices"][0]["token_ids"]) == 5
    finally:
        t0 = time.monotonic()
        assert _stop(proc) == 0
        assert time.monotonic() - t0 < 20
    assert not sock.exists()
