"""``spoolrl serve`` as a real process refuses oversized and malformed request bodies before reading
them: 413 for a 10 GB Content-Length, 400 for a negative or non-numeric one (aiohttp's parser answers
those with a text body); the server keeps serving."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from train_node.infer.httpbase import MAX_BODY_BYTES

REPO = Path(__file__).resolve().parents[2]


def _raw(port: int, head: str, body: bytes = b"") -> tuple[int, Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head.encode() + b"\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    head_part, payload = data.split(b"\r\n\r\n", 1)
    is_json = b"content-type: application/json" in head_part.lower()
    return status, json.loads(payload or b"null") if is_json else payload.decode(errors="replace")


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def _post(path: str, length: str, secret: str = "") -> str:
    auth = f"Authorization: Bearer {secret}\r\n" if secret else ""
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}Content-Length: {length}\r\n"


def test_oversized_and_malformed_bodies_are_refused(models: dict[str, Path], tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "hpc.cli", "serve", "--model", str(models["a"]), "--threads", "1",
                             "--port", "0", "--ready-file", str(ready), "--secret-file", str(secret)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        port = int(json.loads(ready.read_text())["url"].rsplit(":", 1)[1])
        t0 = time.monotonic()
        status, body = _raw(port, _post("/v1/completions", str(10 * 2**30)))
        assert status == 413 and str(MAX_BODY_BYTES) in json.dumps(body) and time.monotonic() - t0 < 10
        assert _raw(port, _post("/reload", str(MAX_BODY_BYTES + 1), "s3cret"))[0] == 413
        for bad in ("-1", "12abc", "99999999999999999999"):
            assert _raw(port, _post("/v1/completions", bad))[0] == 400, bad
        nested = b"[" * 100_000 + b"]" * 100_000
        assert _raw(port, _post("/v1/completions", str(len(nested))), nested)[0] == 400
        ok = json.dumps({"prompt": [1, 2, 3], "max_tokens": 2}).encode()
        assert _raw(port, _post("/v1/completions", str(len(ok))), ok)[0] == 200, "still serving"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
