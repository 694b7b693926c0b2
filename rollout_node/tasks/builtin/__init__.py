"""The built-in task set: four small Python repositories written for spoolrl, each with real bugs.

Guarantees:
- ``repos/<name>/`` holds each repository as plain files (no ``.git``); :func:`ensure_builtin_repos`
  materialises them as bare mirrors in a cache dir with deterministic commit ids.
- ``tasks.jsonl`` holds the instances in SWE-bench JSONL form; it is generated from ``spec.py`` by
  ``python -m rollout_node.tasks.builtin.generate`` and its ``base_commit`` values equal the
  deterministic commit ids (a test checks both).
- Tests run with pytest and the standard library only (no network, no installs).
"""

from __future__ import annotations

from pathlib import Path

from rollout_node.tasks.repos import ensure_mirror

HERE = Path(__file__).resolve().parent
TASKS_JSONL = HERE / "tasks.jsonl"
REPOS_DIR = HERE / "repos"
OWNER = "spoolrl"


def builtin_repos() -> dict[str, Path]:
    """``owner/name`` -> the packaged source directory of every built-in repository."""
    return {f"{OWNER}/{p.name}": p for p in sorted(REPOS_DIR.iterdir()) if p.is_dir()}


def ensure_builtin_repos(cache_dir: Path) -> dict[str, Path]:
    """Create (or reuse) a bare mirror of every built-in repository in ``cache_dir``; repo -> mirror path."""
    return {repo: ensure_mirror(Path(cache_dir), repo, src)[0] for repo, src in builtin_repos().items()}


def builtin_commits(cache_dir: Path) -> dict[str, str]:
    """repo -> the deterministic base commit id (builds the mirrors as a side effect)."""
    return {repo: ensure_mirror(Path(cache_dir), repo, src)[1] for repo, src in builtin_repos().items()}
