"""A ProRL client written from the wire format alone: plain urllib, no project imports."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def http(url: str, path: str, body: Any = None, *, token: str | None = None, method: str | None = None,
         timeout: float = 120.0) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, JSON body, headers) of one request; written from the wire format alone."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method or ("GET" if body is None else "POST"))
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}"), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}"), dict(err.headers)


def wait_file(path: Path, proc: subprocess.Popen[bytes], log: Path, limit_s: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"process did not start: {log.read_text()[-3000:]}")
        time.sleep(0.1)
    return dict(json.loads(path.read_text()))
