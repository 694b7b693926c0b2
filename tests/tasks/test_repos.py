"""Built-in repositories: deterministic commits, mirrors, agent work dirs and the host-safe diff."""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hpc.errors import SpoolrlError, UsageError
from rollout_node.tasks import collect_diff, ensure_builtin_repos, find_mirror, load_tasks, prepare_workdir
from rollout_node.tasks.builtin import TASKS_JSONL, builtin_commits, generate
from rollout_node.tasks.repos import run_git


def git(*args: str | Path) -> str:
    return run_git(list(args)).stdout.decode().strip()


def test_base_commits_are_deterministic_and_match_the_jsonl(tmp_path: Path) -> None:
    first = builtin_commits(tmp_path / "a")
    second = builtin_commits(tmp_path / "b")
    assert first == second
    for task in load_tasks("builtin"):
        assert task.base_commit == first[task.repo], task.instance_id
    # the commit depends on content only: identity, dates and message are fixed
    info = git("--git-dir", tmp_path / "a" / "spoolrl__textkit.git", "log", "-1", "--format=%an|%ae|%aI|%cI|%s", "main")
    assert info == "spoolrl tasks|tasks@spoolrl.invalid|2025-01-01T00:00:00+00:00|2025-01-01T00:00:00+00:00|Import spoolrl/textkit"


def test_tasks_jsonl_is_generated_from_the_spec() -> None:
    assert generate.render() == TASKS_JSONL.read_text(), "run: python -m rollout_node.tasks.builtin.generate"


def test_ensure_builtin_repos_is_idempotent_and_race_safe(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: ensure_builtin_repos(cache), range(4)))
    assert all(r == results[0] for r in results)
    assert sorted(p.name for p in cache.iterdir()) == sorted(p.name for p in results[0].values())
    for repo, path in results[0].items():
        assert find_mirror(cache, repo) == path
    with pytest.raises(UsageError, match="prepare_repos.py"):
        find_mirror(cache, "someone/else")


def test_prepare_workdir_has_no_future_history_and_collect_diff_sees_all_changes(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    ensure_builtin_repos(cache)
    task = next(t for t in load_tasks("builtin") if t.instance_id == "spoolrl__textkit-1")
    work = tmp_path / "work"
    prepare_workdir(task, work, cache)
    assert git("-C", work, "rev-parse", "HEAD") == task.base_commit
    assert git("-C", work, "rev-list", "--all", "--count") == "1"
    assert not (work / ".git" / "FETCH_HEAD").exists()
    with pytest.raises(UsageError, match="must be empty"):
        prepare_workdir(task, work, cache)
    # an edit, a new file, a deletion, a commit by the agent, and junk that must not show up
    core = work / "textkit" / "core.py"
    core.write_text(core.read_text().replace("return text[:width] + suffix", "return text[: width - len(suffix)] + suffix"))
    (work / "NOTES.txt").write_text("new file\n")
    (work / "README.txt").unlink()
    subprocess.run(["git", "-C", str(work), "commit", "-qam", "agent commit"], check=True)
    (work / "textkit" / "__pycache__").mkdir()
    (work / "textkit" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0junk")
    (work / ".pytest_cache").mkdir()
    (work / ".pytest_cache" / "x").write_text("junk")
    diff = collect_diff(work, task, cache)
    assert "diff --git a/textkit/core.py b/textkit/core.py" in diff
    assert "+NOTES.txt" not in diff and "diff --git a/NOTES.txt b/NOTES.txt" in diff
    assert "deleted file mode" in diff and "README.txt" in diff
    assert "__pycache__" not in diff and ".pytest_cache" not in diff
    # the diff re-applies on a fresh checkout
    fresh = tmp_path / "fresh"
    prepare_workdir(task, fresh, cache)
    run_git(["-C", fresh, "apply", "-"], input=diff.encode())
    assert (fresh / "NOTES.txt").read_text() == "new file\n" and not (fresh / "README.txt").exists()


def test_collect_diff_ignores_the_agents_git_config(tmp_path: Path) -> None:
    """Filter drivers, fsmonitor and hooks in the agent's .git would run on the host if we used it."""
    cache = tmp_path / "cache"
    ensure_builtin_repos(cache)
    task = load_tasks("builtin")[0]
    work = tmp_path / "work"
    prepare_workdir(task, work, cache)
    pwned = tmp_path / "pwned"
    with open(work / ".git" / "config", "a") as f:
        f.write(f'[filter "evil"]\n\tclean = touch {pwned}; cat\n[core]\n\tfsmonitor = touch {pwned}\n')
    (work / ".gitattributes").write_text("* filter=evil\n")
    (work / "new.py").write_text("x = 1\n")
    run_git(["-C", work, "status"], check=False)  # the agent's own git would fire the payload...
    assert pwned.exists()
    pwned.unlink()
    diff = collect_diff(work, task, cache)  # ...collect_diff must not
    assert not pwned.exists()
    assert "new.py" in diff and ".gitattributes" in diff


def test_run_repo_cache_defaults_to_run_repos(tmp_path: Path) -> None:
    from hpc.config import TasksConfig
    from rollout_node.tasks import run_repo_cache
    cache = run_repo_cache(TasksConfig(), tmp_path / "run")
    assert cache == tmp_path / "run" / "repos"
    assert find_mirror(cache, "spoolrl/textkit").is_dir()
    assert run_repo_cache(TasksConfig(repo_cache=str(tmp_path / "elsewhere"), source="x.jsonl"), tmp_path) \
        == tmp_path / "elsewhere"
    assert not (tmp_path / "elsewhere").exists()  # only built-in sources are materialised


def test_prepare_workdir_on_a_stalled_filesystem_is_cut_at_its_time_limit(tmp_path: Path) -> None:
    """A mirror with a file that never answers (a FIFO with no writer as its objects/info/alternates:
    what a read from a hung shared filesystem looks like to git) makes the checkout hang; the time
    limit kills git and its children and says so, instead of holding an INIT worker forever."""
    cache = tmp_path / "cache"
    ensure_builtin_repos(cache)
    task = load_tasks("builtin")[0]
    mirror = find_mirror(cache, task.repo)
    (mirror / "objects" / "info").mkdir(exist_ok=True)
    os.mkfifo(mirror / "objects" / "info" / "alternates")
    work = tmp_path / "work"
    t0 = time.monotonic()
    with pytest.raises(SpoolrlError, match="time limit"):
        prepare_workdir(task, work, cache, timeout_s=2.0)
    assert time.monotonic() - t0 < 10
    time.sleep(0.2)
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_mentions(p, str(work))]
    assert left == [], "git processes survived the time limit"


def _cmdline_mentions(proc: Path, text: str) -> bool:
    try:
        return text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
