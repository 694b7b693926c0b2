"""The pipeline's view of tasks and sandboxes: a small interface, and its binding to the real parts.

:class:`TaskOps` is what the stages call (parse a spool task, prepare a work dir, collect the
diff, evaluate it, open a sandbox); :func:`real_task_ops` binds it to ``rollout_node.tasks`` and
``rollout_node.sandbox``. Unit tests substitute small stand-ins through the same interface.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hpc.config import RunConfig
from hpc.errors import UsageError
from hpc.paths import RunPaths
from hpc.records import SPOOL_KEYS
from hpc.trajectory import Status
from rollout_node.pipeline.policy import EpisodeSandbox
from rollout_node.tasks.instance import TaskInstance

if TYPE_CHECKING:
    from rollout_node.sandbox.images import ImageCache


@dataclass(frozen=True)
class EvalOutcome:
    """What EVAL concluded: a reward (None when the harness failed) and a status."""

    reward: float | None
    status: Status = Status.OK
    details: dict[str, Any] = field(default_factory=dict)


class TaskOps(Protocol):
    """Everything the stages need from tasks and sandboxes."""

    def parse(self, task: Mapping[str, Any]) -> TaskInstance: ...

    def image(self, task: TaskInstance) -> str: ...

    def stage_image(self, image: str) -> None: ...

    def prepare(self, task: TaskInstance, workdir: Path, timeout_s: float | None = None) -> None: ...

    def open_sandbox(self, workdir: Path, image: str) -> AbstractContextManager[EpisodeSandbox]: ...

    def collect_diff(self, task: TaskInstance, workdir: Path) -> str: ...

    def evaluate(self, task: TaskInstance, diff: str, scratch: Path, timeout_s: float) -> EvalOutcome: ...

    def image_cached(self, image: str) -> bool: ...


def spool_task_fields(task: Mapping[str, Any]) -> dict[str, Any] | None:
    """The SWE-bench fields carried by a spool task record (nested under ``instance`` or at the top
    level), or None for a reference by ``instance_id`` (what the trainer's feeder puts)."""
    inner = task.get("instance")
    if isinstance(inner, Mapping):
        return dict(inner)
    if "patch" not in task:
        return None
    data = {k: v for k, v in task.items() if k not in SPOOL_KEYS}
    data.setdefault("instance_id", str(task.get("task_id")))
    return data




class RealTaskOps:
    """Binds :class:`TaskOps` to rollout_node.tasks (repos, harness) and rollout_node.sandbox."""

    def __init__(self, paths: RunPaths, config: RunConfig) -> None:
        self.paths = paths
        self.config = config
        self.repo_cache = Path(config.tasks.repo_cache) if config.tasks.repo_cache else paths.repos
        self._repos_lock = threading.Lock()
        self._builtin_ready = False
        self._by_id: dict[str, TaskInstance] | None = None

    def parse(self, task: Mapping[str, Any]) -> TaskInstance:
        """A spool record -> TaskInstance: inline fields, or ``instance_id`` looked up in tasks.source."""
        from rollout_node.tasks import task_from_dict

        fields = spool_task_fields(task)
        if fields is not None:
            return task_from_dict(fields, where=f"spool task {task.get('task_id')!r}")
        instance_id = str(task.get("instance_id") or "")
        found = self._instances().get(instance_id)
        if found is None:
            raise UsageError(f"spool task {task.get('task_id')!r}: instance_id {instance_id!r} is not in "
                             f"tasks.source {self.config.tasks.source!r}")
        return found

    def _instances(self) -> dict[str, TaskInstance]:
        with self._repos_lock:
            if self._by_id is None:
                from rollout_node.tasks import load_tasks

                self._by_id = {t.instance_id: t for t in load_tasks(self.config.tasks.source)}
            return self._by_id

    def image(self, task: TaskInstance) -> str:
        return task.image or self.config.sandbox.image or ""

    def _ensure_repos(self) -> None:
        """Built-in tasks: build their mirrors into RUN/repos once (atomic, safe across nodes)."""
        if self.config.tasks.repo_cache:
            return
        with self._repos_lock:
            if not self._builtin_ready:
                from rollout_node.tasks import ensure_builtin_repos

                ensure_builtin_repos(self.repo_cache)
                self._builtin_ready = True

    def _image_cache(self) -> ImageCache:
        from rollout_node.sandbox.images import ImageCache
        from rollout_node.sandbox.sandbox import user_scratch

        cfg = self.config.sandbox
        return ImageCache(Path(cfg.image_cache_dir) if cfg.image_cache_dir else user_scratch(cfg) / "images",
                          int(cfg.image_cache_gb * 2**30))

    def stage_image(self, image: str) -> None:
        """INIT stages the image into the node's cache (an archive or SIF is extracted once), so RUN
        starts its sandbox from local disk. Raises SandboxError when the image cannot be staged."""
        if self.config.sandbox.runtime == "local":
            return
        from rollout_node.sandbox.images import default_image

        self._image_cache().stage(image or default_image()).release()

    def prepare(self, task: TaskInstance, workdir: Path, timeout_s: float | None = None) -> None:
        from rollout_node.tasks import prepare_workdir

        self._ensure_repos()
        prepare_workdir(task, workdir, self.repo_cache, timeout_s)

    def open_sandbox(self, workdir: Path, image: str) -> AbstractContextManager[EpisodeSandbox]:
        from rollout_node.sandbox import open_sandbox

        return open_sandbox(self.config.sandbox, workdir, image=image or None,
                            disk_bytes=int(self.config.rollout.scratch_per_episode_gb * 2**30))

    def collect_diff(self, task: TaskInstance, workdir: Path) -> str:
        from rollout_node.tasks import collect_diff

        return collect_diff(workdir, task, self.repo_cache)

    def evaluate(self, task: TaskInstance, diff: str, scratch: Path, timeout_s: float) -> EvalOutcome:
        from rollout_node.tasks import evaluate

        self._ensure_repos()
        result = evaluate(task, diff, sandbox_cfg=self.config.sandbox, scratch_dir=scratch, repo_cache=self.repo_cache,
                          timeout_s=timeout_s)
        details = {"eval_status": result.status, "eval_s": round(result.duration_s, 3),
                   "tests_passed": sum(v == "PASSED" for v in result.outcomes.values()),
                   "tests_total": len(result.outcomes), "diff_applied": result.diff_applied,
                   # False: the runner ended without its whole result frame (killed, or the code under test)
                   "results_read": not any(f.startswith("results:") for f in result.flags)}
        if result.infrastructure_failure:
            return EvalOutcome(None, Status.HARNESS_ERROR, {**details, "error": result.error})
        # A test run past its time limit is the agent's code's fault (e.g. an endless loop): reward 0.
        status = Status.TIMEOUT if result.status == "timeout" else Status.OK
        return EvalOutcome(float(result.reward), status, details)

    def image_cached(self, image: str) -> bool:
        """True when INIT/RUN would find ``image`` staged on this node (a directory is used in place)."""
        from rollout_node.sandbox.images import default_image

        src = Path(image or default_image())
        if src.is_dir() or not src.exists():
            return True
        return self._image_cache().is_staged(src)
