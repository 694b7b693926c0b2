"""The built-in task sets, on small Python repositories written for spoolrl.

The sets, selected by ``tasks.source`` (names in :data:`hpc.config.tasks.BUILTIN_TASK_SETS`):
- ``builtin``: 16 bug fixes in four repositories (``tasks.jsonl``, from ``spec.py``): real bugs that
  a capable model can fix and a tiny random one cannot (its reward stays 0).
- ``builtin-pick``: the learnable family (``pick.jsonl``, from ``pick.py``): set one value of the
  ``summary`` repository to the one of four that the statement names. The demo trains on it.
- ``builtin-lookup``, ``builtin-lookup-heldout``, ``builtin-lookup-warm``: three disjoint sets (64, 32,
  32; ``lookup*.jsonl``, from ``lookup.py``) whose answer is only in a tool observation: copy a setting's
  value from its file in the ``lookup`` repository into the code (``scripts/bench_learning_real.py``).

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
PICK_JSONL = HERE / "pick.jsonl"
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
