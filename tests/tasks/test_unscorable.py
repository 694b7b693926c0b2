"""collect_diff tells a tree the agent made undiffable (UnscorableTree: its outcome, reward 0) from a
harness that cannot diff at all (SpoolrlError: infrastructure). Real git, real built-in mirrors; the
unreadable-file case runs as the unprivileged CI user (root ignores permission bits)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from hpc.errors import SpoolrlError
from rollout_node.tasks import ensure_builtin_repos, find_mirror, load_tasks, prepare_workdir
from rollout_node.tasks.repos import UnscorableTree, collect_diff, run_git
from tests.unprivileged import run_unprivileged

UNREADABLE = """
import os, sys, tempfile
from pathlib import Path
from rollout_node.tasks import ensure_builtin_repos, load_tasks, prepare_workdir
from rollout_node.tasks.repos import UnscorableTree, collect_diff
with tempfile.TemporaryDirectory() as name:
    tmp = Path(name)
    task = load_tasks("builtin")[0]
    ensure_builtin_repos(tmp / "repos")
    prepare_workdir(task, tmp / "work", tmp / "repos")
    os.chmod(tmp / "work" / "intervals" / "interval.py", 0)
    try:
        collect_diff(tmp / "work", task, tmp / "repos")
        print("DIFFED")
    except UnscorableTree as exc:
        print("UNSCORABLE", exc)
"""


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    cache = tmp_path / "repos"
    ensure_builtin_repos(cache)
    prepare_workdir(load_tasks("builtin")[0], tmp_path / "work", cache)
    return tmp_path / "work", cache


def test_fifo_over_a_tracked_file_is_unscorable(tree: tuple[Path, Path]) -> None:
    work, cache = tree
    (work / "README.txt").unlink()
    os.mkfifo(work / "README.txt")
    with pytest.raises(UnscorableTree, match=r"README.txt: a FIFO"):
        collect_diff(work, load_tasks("builtin")[0], cache)


def test_nested_repository_without_commit_is_unscorable(tree: tuple[Path, Path]) -> None:
    work, cache = tree
    run_git(["init", "-q", work / "sub"])
    with pytest.raises(UnscorableTree, match=r"sub: a nested git repository"):
        collect_diff(work, load_tasks("builtin")[0], cache)


def test_an_ordinary_tree_diffs(tree: tuple[Path, Path]) -> None:
    work, cache = tree
    (work / "NEW.txt").write_text("new\n")
    assert "b/NEW.txt" in collect_diff(work, load_tasks("builtin")[0], cache)


def test_a_broken_mirror_stays_infrastructure(tree: tuple[Path, Path]) -> None:
    """A clean tree and a mirror that lost its objects: the pristine control fails too, so it is the
    node's fault (retried), never charged to the agent."""
    work, cache = tree
    task = load_tasks("builtin")[0]
    shutil.rmtree(find_mirror(cache, task.repo) / "objects" / "pack")
    with pytest.raises(SpoolrlError) as caught:
        collect_diff(work, task, cache)
    assert not isinstance(caught.value, UnscorableTree), caught.value


def test_unreadable_tracked_file_is_unscorable_for_an_unprivileged_node() -> None:
    proc = run_unprivileged(sys.executable, "-c", UNREADABLE, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("UNSCORABLE"), proc.stdout + proc.stderr[-1000:]
    assert "intervals/interval.py: a file without owner read permission" in proc.stdout
