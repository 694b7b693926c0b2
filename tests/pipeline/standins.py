"""Small local stand-ins for tasks and sandboxes, used ONLY by the pipeline's unit tests.

They let the node's logic (groups, retries, cancellation, drain, staleness, write-then-finish)
be tested in seconds with the real spool; the integration tests use the real sandboxes and the
real EVAL harness. The "sandbox" runs bash in the work dir (no isolation); the "harness" gives
reward 1 when the diff adds the line ``FIXED``.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc.errors import SandboxError
from hpc.trajectory import Status
from rollout_node.pipeline.bindings import EvalOutcome

GOLD = "--- a/bug.txt\n+++ b/bug.txt\n@@ -1 +1 @@\n-BUG\n+FIXED\n"


@dataclass(frozen=True)
class FakeTask:
    instance_id: str
    patch: str = GOLD
    problem_statement: str = "replace BUG by FIXED in bug.txt"
    FAIL_TO_PASS: tuple[str, ...] = ("test_bug.py::test_fixed",)
    image: str = ""


@dataclass
class Result:
    output: str
    exit_code: int | None
    timed_out: bool = False


class LocalShell:
    """bash -c in the work dir; close() kills it for good (later calls raise SandboxError)."""

    disk_verdict = ""  # no disk budget here

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.closed = False
        self.procs: list[subprocess.Popen[str]] = []
        self.lock = threading.Lock()

    def run(self, command: str, *, timeout_s: float | None = None) -> Result:
        if self.closed:
            raise SandboxError("sandbox closed")
        with self.lock:
            proc = subprocess.Popen(["bash", "-c", command], cwd=self.workdir, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
            self.procs.append(proc)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            if self.closed:
                raise SandboxError("sandbox killed during the command")
            return Result(out, proc.returncode)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            return Result(out, None, timed_out=True)

    def close(self) -> None:
        self.closed = True
        with self.lock:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()


@dataclass
class FakeOps:
    """TaskOps over FakeTask; counters let tests see what happened; knobs inject faults."""

    fail_prepare: set[str] = field(default_factory=set)
    harness_errors: dict[str, int] = field(default_factory=dict)  # task_id -> harness failures to inject
    eval_delay_s: float = 0.0
    cached: set[str] = field(default_factory=set)
    open_sandboxes: int = 0
    max_open: int = 0
    evaluated: list[str] = field(default_factory=list)
    prepared: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def parse(self, task: Mapping[str, Any]) -> FakeTask:
        if "broken" in task:
            raise ValueError("field 'patch' is missing")
        return FakeTask(instance_id=str(task["task_id"]), image=str(task.get("image", "")))

    def image(self, task: Any) -> str:
        return str(task.image)

    def stage_image(self, image: str) -> None:
        if image == "missing-image":
            raise SandboxError(f"image {image!r} not found")

    def prepare(self, task: Any, workdir: Path, timeout_s: float | None = None) -> None:
        with self.lock:
            self.prepared.append(task.instance_id)
        if task.instance_id in self.fail_prepare:
            raise OSError("injected: repository checkout failed")
        workdir.mkdir(parents=True)
        (workdir / "bug.txt").write_text("BUG\n")
        for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
            subprocess.run(cmd, cwd=workdir, check=True)

    @contextmanager
    def open_sandbox(self, workdir: Path, image: str) -> Iterator[LocalShell]:
        if image == "missing-image":
            raise SandboxError(f"image {image!r} not found")
        shell = LocalShell(workdir)
        with self.lock:
            self.open_sandboxes += 1
            self.max_open = max(self.max_open, self.open_sandboxes)
        try:
            yield shell
        finally:
            shell.close()
            with self.lock:
                self.open_sandboxes -= 1

    def collect_diff(self, task: Any, workdir: Path) -> str:
        return subprocess.run(["git", "diff"], cwd=workdir, capture_output=True, text=True, check=True).stdout

    def evaluate(self, task: Any, diff: str, scratch: Path, timeout_s: float) -> EvalOutcome:
        time.sleep(self.eval_delay_s)
        with self.lock:
            self.evaluated.append(task.instance_id)
            left = self.harness_errors.get(task.instance_id, 0)
            if left:
                self.harness_errors[task.instance_id] = left - 1
        if left:
            return EvalOutcome(None, Status.HARNESS_ERROR, {"error": "injected harness crash"})
        return EvalOutcome(1.0 if "+FIXED" in diff else 0.0, Status.OK)

    def image_cached(self, image: str) -> bool:
        return image in self.cached
