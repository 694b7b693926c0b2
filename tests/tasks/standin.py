"""A tiny local stand-in for rollout_node.sandbox.open_sandbox (no isolation), for harness logic tests.

The real bwrap sandbox is exercised by test_harness_bwrap.py; this stand-in only lets the
harness's tree building and parsing be tested where no image is available.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StandinResult:
    output: str
    exit_code: int | None
    timed_out: bool
    duration_s: float
    truncated: bool = False


class StandinSandbox:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.calls: list[list[str]] = []

    def exec(self, argv: list[str], *, timeout_s: float | None) -> StandinResult:
        self.calls.append(argv)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(argv, cwd=self.workdir, capture_output=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"") + (exc.stderr or b"")
            return StandinResult(out.decode(errors="replace"), None, True, time.monotonic() - t0)
        out = proc.stdout + proc.stderr
        return StandinResult(out.decode(errors="replace"), proc.returncode, False, time.monotonic() - t0)


@contextmanager
def open_standin(cfg: Any, workdir: Path, *, image: str | None = None) -> Iterator[StandinSandbox]:
    yield StandinSandbox(Path(workdir))
