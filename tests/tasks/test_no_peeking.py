"""Issue 13, point 5: the work tree handed to the agent holds nothing of the answer.

The repo cache's mirror of a built-in repository is given what a SWE-bench mirror has: the gold fix
of every task of that repository as a commit (branches, a tag, a later commit on top, a stash-like
ref). A real rollout node then runs the real INIT on one task and the scripted ``peek`` action asks
git, from inside the real bwrap sandbox, what it can see: every commit, reflog entry, stash, ref and
object must be base_commit's, and no fix commit, tree or blob may be readable.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from hpc.spool import Spool
from hpc.trajectory import Status
from rollout_node.tasks import TaskInstance, ensure_builtin_repos, find_mirror, load_tasks
from rollout_node.tasks.repos import git_out, run_git
from tests.pipeline.readback import written
from tests.pipeline.test_node_real import _need_sandbox, make_run, run_node

pytestmark = pytest.mark.sandbox
_need_sandbox = _need_sandbox  # the real-sandbox precondition, shared with test_node_real


def _commit_fix(mirror: Path, task: TaskInstance, ref: str) -> list[str]:
    """Commit ``task``'s gold patch on its base in ``mirror`` as ``ref``; the new commit, tree, blobs."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        tree = Path(tmp) / "tree"
        tree.mkdir()
        git = ["--git-dir", str(mirror), "--work-tree", str(tree)]
        run_git([*git, "checkout", "-q", "-f", task.base_commit, "--", "."], env=env, cwd=tree)
        run_git([*git, "apply", "--index", "-"], env=env, cwd=tree, input=task.patch.encode())
        tree_id = git_out([*git, "write-tree"], env=env)
        commit = git_out(["--git-dir", str(mirror), "commit-tree", tree_id, "-p", task.base_commit, "-m", ref])
    run_git(["--git-dir", str(mirror), "update-ref", ref, commit])
    changed = git_out(["--git-dir", str(mirror), "diff-tree", "-r", "--no-commit-id", "--format=", commit]).splitlines()
    blobs = [line.split()[3] for line in changed]  # ":old new oldsha newsha M\tpath" -> the fixed blob
    return [commit, tree_id, *blobs]


def test_the_agent_sees_only_base_commit(tmp_path: Path) -> None:
    tasks = load_tasks("builtin")
    target = tasks[0]
    siblings = [t for t in tasks if t.repo == target.repo]
    assert len(siblings) > 1, "the other tasks of the repository are what must stay hidden"
    paths, cfg = make_run(tmp_path, "rollout.scripted_plan=peek", "algorithm.group_size=1",
                          "algorithm.drop_zero_variance=false")
    ensure_builtin_repos(paths.repos)
    mirror = find_mirror(paths.repos, target.repo)
    hidden: list[str] = []
    for i, task in enumerate(siblings):
        hidden += _commit_fix(mirror, task, f"refs/heads/fix-{i}")
    later = git_out(["--git-dir", str(mirror), "commit-tree", f"{hidden[0]}^{{tree}}", "-p", hidden[0], "-m", "later"])
    for ref in ("refs/heads/main", "refs/tags/v-fixed", "refs/stash"):
        run_git(["--git-dir", str(mirror), "update-ref", ref, later])
    hidden.append(later)
    listed = git_out(["--git-dir", str(mirror), "rev-list", "--objects", target.base_commit]).splitlines()
    base_objects = {line.split()[0] for line in listed}
    assert not base_objects & set(hidden), "each hidden object differs from every base object"
    record = {"task_id": "peek", "instance_id": target.instance_id, "group_size": 1, "peek_objects": hidden}
    Spool(paths.root, cfg.spool).put_tasks([record])
    run_node(paths, cfg, tmp_path)
    (t,) = written(paths, cfg)["peek"]
    assert t.status == Status.OK and t.metrics["sample_attempt"] == 0, t.metrics.get("error")
    log_all, reflog, stash, objects, refs, probe, alternates = [str(o) for o in t.metrics["observations"][:7]]
    assert log_all.split() == [target.base_commit], log_all
    assert set(reflog.split()) == {target.base_commit}, reflog
    assert stash.strip() == "", stash
    assert set(objects.split()) == base_objects, "objects beyond base_commit's are in the work tree's store"
    assert refs.split() == ["refs/heads/main"], refs
    assert probe.strip() == "probed", f"a hidden object is readable from the sandbox: {probe}"
    assert alternates.strip().splitlines()[0] != str(mirror / "objects") and "objects" not in alternates, alternates
