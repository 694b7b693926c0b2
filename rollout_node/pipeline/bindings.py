"""The pipeline's view of tasks and sandboxes: a small interface, and its binding to the real parts.

:class:`TaskOps` is what the stages call (parse a spool task, prepare a work dir, collect the
diff, evaluate it, open a sandbox); :func:`real_task_ops` binds it to ``rollout_node.tasks`` and
``rollout_node.sandbox``. Unit tests substitute small stand-ins through the same interface.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hpc.config import RunConfig
from hpc.paths import RunPaths
from hpc.trajectory import Status


@dataclass(frozen=True)
class EvalOutcome:
    """What EVAL concluded: a reward (None when the harness failed) and a status."""

    reward: float | None
    status: Status = Status.OK
    details: dict[str, Any] = field(default_factory=dict)


class TaskOps(Protocol):
    """Everything the stages need from tasks and sandboxes (five calls)."""

    def parse(self, task: Mapping[str, Any]) -> Any: ...

    def image(self, task: Any) -> str: ...

    def prepare(self, task: Any, workdir: Path) -> None: ...

    def open_sandbox(self, workdir: Path, image: str) -> AbstractContextManager[Any]: ...

    def collect_diff(self, task: Any, workdir: Path) -> str: ...

    def evaluate(self, task: Any, diff: str, scratch: Path, timeout_s: float) -> EvalOutcome: ...

    def image_cached(self, image: str) -> bool: ...


def spool_task_fields(task: Mapping[str, Any]) -> dict[str, Any]:
    """The SWE-bench fields of a spool task record: nested under ``instance`` or at the top level."""
    inner = task.get("instance")
    if isinstance(inner, Mapping):
        return dict(inner)
    data = {k: v for k, v in task.items() if k not in ("task_id", "group_size", "task_version")}
    data.setdefault("instance_id", str(task.get("task_id")))
    return data


class RealTaskOps:
    """Binds :class:`TaskOps` to rollout_node.tasks (repos, harness) and rollout_node.sandbox."""

    def __init__(self, paths: RunPaths, config: RunConfig) -> None:
        self.paths = paths
        self.config = config
        self.repo_cache = Path(config.tasks.repo_cache) if config.tasks.repo_cache else paths.repos
        self._builtin_ready = False

    def parse(self, task: Mapping[str, Any]) -> Any:
        from rollout_node.tasks.instance import task_from_dict

        return task_from_dict(spool_task_fields(task), where=f"spool task {task.get('task_id')!r}")

    def image(self, task: Any) -> str:
        return str(getattr(task, "image", "") or self.config.sandbox.image or "")

    def _ensure_repos(self) -> None:
        if self._builtin_ready or self.config.tasks.repo_cache:
            return
        from rollout_node.tasks import repos

        ensure = getattr(repos, "ensure_builtin_repos", None)
        if ensure is not None:
            ensure(self.repo_cache)
        self._builtin_ready = True

    def prepare(self, task: Any, workdir: Path) -> None:
        from rollout_node.tasks.repos import prepare_workdir

        self._ensure_repos()
        prepare_workdir(task, workdir, self.repo_cache)

    def open_sandbox(self, workdir: Path, image: str) -> AbstractContextManager[Any]:
        from rollout_node.sandbox import open_sandbox

        return open_sandbox(self.config.sandbox, workdir, image=image or None)  # type: ignore[no-any-return]

    def collect_diff(self, task: Any, workdir: Path) -> str:
        from rollout_node.tasks.repos import collect_diff

        return collect_diff(workdir, task, self.repo_cache)

    def evaluate(self, task: Any, diff: str, scratch: Path, timeout_s: float) -> EvalOutcome:
        from rollout_node.tasks import evaluate

        result = evaluate(task, diff, self.config.sandbox, scratch)
        status = Status(getattr(result, "status", Status.OK))
        reward = getattr(result, "reward", None)
        details = {k: v for k, v in (getattr(result, "metrics", None) or {}).items()} if hasattr(result, "metrics") \
            else {}
        return EvalOutcome(reward=None if status.infrastructure else reward, status=status, details=details)

    def image_cached(self, image: str) -> bool:
        try:
            from rollout_node.sandbox import image_cached
        except ImportError:
            return True  # no image cache: every image is as good as cached
        return bool(image_cached(self.config.sandbox, image))
