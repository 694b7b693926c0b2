"""Tasks and reward: SWE-bench task instances, the repo cache, test-log parsers and the EVAL harness.

Public API (stable names, used by the pipeline):
- :func:`load_tasks` (``"builtin"`` or a JSONL path) -> list of :class:`TaskInstance`.
- :func:`ensure_builtin_repos` (cache dir -> mirrors of the built-in repositories);
  :func:`run_repo_cache` (the cache a run uses: ``tasks.repo_cache`` or ``RUN/repos``, built-ins included).
- :func:`prepare_workdir` (INIT: checkout at base commit) and :func:`collect_diff` (after RUN).
- :func:`evaluate` -> :class:`EvalResult` (EVAL: tamper-proof test run in a fresh sandbox).
Importing this package is cheap (no sandbox runtime is imported until ``evaluate`` runs).
"""

from __future__ import annotations

from rollout_node.tasks.builtin import ensure_builtin_repos
from rollout_node.tasks.harness import EvalResult, evaluate
from rollout_node.tasks.instance import TaskInstance, load_tasks, task_from_dict
from rollout_node.tasks.mirrors import run_repo_cache
from rollout_node.tasks.repos import collect_diff, find_mirror, prepare_workdir

__all__ = ["EvalResult", "TaskInstance", "collect_diff", "ensure_builtin_repos", "evaluate", "find_mirror",
           "load_tasks", "prepare_workdir", "run_repo_cache", "task_from_dict"]
