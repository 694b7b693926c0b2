"""Shared by the service tests: a tiny model's tokenizer, the stand-in backend process, a plain
client lives in wire_client.py), and cheap task ops for the concurrency test.

``NullOps`` is the pipeline's TaskOps with no repository and no sandbox (prepare = mkdir, the
"sandbox" answers every tool with empty output, EVAL gives reward 1): the concurrency test measures
the API, the spool and the node's bookkeeping, not git and pytest.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_node.pipeline.bindings import EvalOutcome
from tests.service.wire_client import wait_file

DIFF = "--- a/bug.txt\n+++ b/bug.txt\n@@ -1 +1 @@\n-BUG\n+FIXED\n"


def start_standin(tokenizer: Path, tmp: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    ready, log = tmp / "standin.json", tmp / "standin.log"
    proc = subprocess.Popen([sys.executable, "-m", "rollout_node.service.standin", "--tokenizer", str(tokenizer),
                             "--ready-file", str(ready), *args], stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    return proc, str(wait_file(ready, proc, log)["url"])


@dataclass
class _Out:
    output: str = ""
    exit_code: int | None = 0
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0


class NullShell:
    disk_verdict = ""

    def __getattr__(self, _name: str) -> Any:
        return lambda *_a, **_k: _Out()

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class NullTask:
    instance_id: str
    problem_statement: str = "fix it"
    image: str = ""


class NullOps:
    def parse(self, task: Mapping[str, Any]) -> NullTask:
        inner = task.get("instance") or {}
        return NullTask(str(inner.get("instance_id", task.get("instance_id", task["task_id"]))),
                        str(inner.get("problem_statement", "fix it")))

    def image(self, task: Any) -> str:
        return ""

    def stage_image(self, image: str) -> None:
        pass

    def prepare(self, task: Any, workdir: Path, timeout_s: float | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def open_sandbox(self, workdir: Path, image: str) -> Iterator[NullShell]:
        yield NullShell()

    def collect_diff(self, task: Any, workdir: Path) -> str:
        return DIFF

    def evaluate(self, task: Any, diff: str, scratch: Path, timeout_s: float) -> EvalOutcome:
        return EvalOutcome(1.0 if "+FIXED" in diff else 0.0)

    def image_cached(self, image: str) -> bool:
        return True
