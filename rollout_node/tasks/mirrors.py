"""Filling a repo cache (one bare mirror per repository) for compute nodes without internet.

Guarantees: :func:`prepare_cache` mirrors every repository a task set names (from a git URL or a
local path, ``git clone --mirror``), builds the built-in repositories, and then checks that every
``base_commit`` and ``environment_setup_commit`` is present; a new mirror appears atomically
(cloned aside, then renamed). Existing mirrors are reused, or fetched with ``update=True``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hpc.config import TasksConfig
from hpc.config.tasks import builtin_task_file
from hpc.paths import RunPaths
from rollout_node.tasks.builtin import builtin_repos, ensure_builtin_repos
from rollout_node.tasks.instance import TaskInstance
from rollout_node.tasks.repos import has_commit, mirror_name, run_git

DEFAULT_URL = "https://github.com/{repo}.git"


def run_repo_cache(tasks_cfg: TasksConfig, run_dir: Path) -> Path:
    """The repo cache of a run: ``tasks.repo_cache``, else ``RUN/repos``; built-in repos are put there.

    Safe to call from every rollout node at once (mirrors appear atomically).
    """
    cache = Path(tasks_cfg.repo_cache) if tasks_cfg.repo_cache else RunPaths(run_dir).repos
    if builtin_task_file(tasks_cfg.source) is not None:
        ensure_builtin_repos(cache)
    return cache


def mirror_repo(cache_dir: Path, repo: str, source: str, *, update: bool = False) -> tuple[Path, str]:
    """Clone ``source`` as the mirror of ``repo`` (or reuse/update it); (mirror path, action)."""
    target = cache_dir / mirror_name(repo)
    if target.exists():
        if not update:
            return target, "present"
        run_git(["--git-dir", target, "fetch", "--prune", "--quiet", source, "+refs/*:refs/*"])
        return target, "updated"
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".clone-{target.name}-", dir=cache_dir))
    try:
        run_git(["clone", "--mirror", "--quiet", source, tmp / "m.git"])
        os.rename(tmp / "m.git", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target, "cloned"


def prepare_cache(cache_dir: Path, tasks: Iterable[TaskInstance], sources: Mapping[str, str],
                  url_template: str = DEFAULT_URL, *, update: bool = False) -> list[dict[str, Any]]:
    """Mirror every repository of ``tasks``; one report row per repository (missing commits listed)."""
    by_repo: dict[str, set[str]] = {}
    for task in tasks:
        commits = by_repo.setdefault(task.repo, set())
        commits.update(c for c in (task.base_commit, task.environment_setup_commit) if c)
    builtin = builtin_repos()
    if any(repo in builtin and repo not in sources for repo in by_repo):
        ensure_builtin_repos(cache_dir)
    rows = []
    for repo, commits in sorted(by_repo.items()):
        if repo in builtin and repo not in sources:
            path, action, source = cache_dir / mirror_name(repo), "builtin", "package"
        else:
            source = sources.get(repo) or url_template.format(repo=repo)
            path, action = mirror_repo(cache_dir, repo, source, update=update)
        missing = sorted(c for c in commits if not has_commit(path, c))
        rows.append({"repo": repo, "mirror": str(path), "source": source, "action": action,
                     "commits": len(commits), "commits_missing": missing})
    return rows
