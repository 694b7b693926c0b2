"""An external (non built-in) SWE-style task set end to end: scripts/prepare_repos.py mirrors a local
"upstream" repository whose history contains the fix, `spoolrl tasks check` scores gold 1 / empty 0
through the real sandbox with a unittest `test_cmd` and the unittest log parser, and the agent's
checkout does not contain the fix commit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollout_node.tasks import load_tasks, prepare_workdir

ROOT = Path(__file__).resolve().parents[2]
SPOOLRL = [sys.executable, "-m", "hpc.cli"]

CALC = "def div(a, b):\n    return a / b\n"
CALC_FIXED = ("def div(a, b):\n    if b == 0:\n        raise ValueError('division by zero')\n    return a / b\n")
TESTS = ("import unittest\n\nfrom calc import div\n\n\nclass CalcTests(unittest.TestCase):\n"
         "    def test_div(self):\n        self.assertEqual(div(6, 3), 2)\n")
NEW_TEST = "\n    def test_div_by_zero(self):\n        with self.assertRaises(ValueError):\n            div(1, 0)\n"


def sh(*args: str | Path, cwd: Path | None = None) -> str:
    return subprocess.run([str(a) for a in args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def make_upstream(path: Path) -> tuple[str, str, str]:
    """A repo with a base commit and a later fix commit; returns (base, patch, test_patch)."""
    (path / "tests").mkdir(parents=True)
    (path / "calc.py").write_text(CALC)
    (path / "tests" / "__init__.py").write_text("")
    (path / "tests" / "test_calc.py").write_text(TESTS)
    sh("git", "init", "-q", "-b", "main", cwd=path)
    sh("git", "-c", "user.name=u", "-c", "user.email=u@x", "add", "-A", cwd=path)
    sh("git", "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qm", "base", cwd=path)
    base = sh("git", "rev-parse", "HEAD", cwd=path)
    (path / "calc.py").write_text(CALC_FIXED)
    patch = sh("git", "diff", cwd=path) + "\n"
    (path / "tests" / "test_calc.py").write_text(TESTS + NEW_TEST)
    test_patch = sh("git", "diff", "--", "tests", cwd=path) + "\n"
    sh("git", "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qam", "THE FIX", cwd=path)
    return base, patch, test_patch


@pytest.mark.sandbox
def test_prepare_repos_then_tasks_check_with_unittest_parser(tmp_path: Path) -> None:
    from rollout_node.sandbox import bwrap_unavailable_reason

    if why := bwrap_unavailable_reason():
        pytest.skip(why)
    base, patch, test_patch = make_upstream(tmp_path / "upstream")
    task = {"instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": base, "patch": patch,
            "test_patch": test_patch, "problem_statement": "div(1, 0) should raise ValueError",
            "FAIL_TO_PASS": json.dumps(["test_div_by_zero (tests.test_calc.CalcTests)"]),
            "PASS_TO_PASS": json.dumps(["test_div (tests.test_calc.CalcTests)"]),
            "test_cmd": "python3 -m unittest -v", "log_parser": "unittest", "version": "1.0"}
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text(json.dumps(task) + "\n")
    cache = tmp_path / "cache"

    prep = subprocess.run([sys.executable, ROOT / "scripts" / "prepare_repos.py", cache, "--tasks", tasks_file,
                           "--source", f"acme/calc={tmp_path / 'upstream'}"], capture_output=True, text=True)
    assert prep.returncode == 0, prep.stderr
    row = json.loads(prep.stdout.splitlines()[0])
    assert (row["repo"], row["action"], row["commits_missing"]) == ("acme/calc", "cloned", [])

    check = subprocess.run([*SPOOLRL, "tasks", "check", str(tasks_file), "--repo-cache", str(cache),
                            "--scratch", str(tmp_path / "scratch")], capture_output=True, text=True, cwd=ROOT)
    assert check.returncode == 0, check.stdout + check.stderr
    result = json.loads(check.stdout)
    assert (result["instance_id"], result["gold_reward"], result["empty_reward"]) == ("acme__calc-1", 1.0, 0.0)
    assert result["pass_to_pass_failing_at_base"] == [] and result["fail_to_pass_passing_at_base"] == []

    work = tmp_path / "work"
    prepare_workdir(load_tasks(tasks_file)[0], work, cache)
    assert sh("git", "-C", work, "log", "--all", "--format=%s") == "base"  # the fix commit is not reachable
    assert "raise ValueError" not in (work / "calc.py").read_text()


@pytest.mark.sandbox
def test_tasks_check_flags_a_wrong_task_and_exits_nonzero(tmp_path: Path) -> None:
    """A task whose gold patch does not fix the bug (here: gold = empty) is reported, exit status 1."""
    from rollout_node.sandbox import bwrap_unavailable_reason

    if why := bwrap_unavailable_reason():
        pytest.skip(why)
    task = load_tasks("builtin")[0].to_dict()
    task["patch"] = task["test_patch"]  # a "gold" patch that only adds the tests: it fixes nothing
    task["PASS_TO_PASS"] = task["PASS_TO_PASS"] + task["FAIL_TO_PASS"]  # a "P2P" test that fails at base
    tasks_file = tmp_path / "wrong.jsonl"
    tasks_file.write_text(json.dumps(task) + "\n")
    check = subprocess.run([*SPOOLRL, "tasks", "check", str(tasks_file), "--repo-cache", str(tmp_path / "c"),
                            "--scratch", str(tmp_path / "s")], capture_output=True, text=True, cwd=ROOT)
    assert check.returncode == 2 and "is not in the repo cache" in check.stderr  # no mirror yet: a usage error
    subprocess.run([sys.executable, ROOT / "scripts" / "prepare_repos.py", tmp_path / "c", "--tasks", "builtin"],
                   check=True, capture_output=True)
    check = subprocess.run([*SPOOLRL, "tasks", "check", str(tasks_file), "--repo-cache", str(tmp_path / "c"),
                            "--scratch", str(tmp_path / "s")], capture_output=True, text=True, cwd=ROOT)
    assert check.returncode == 1, check.stderr
    row = json.loads(check.stdout)
    assert row["gold_reward"] == 0.0 and row["ok"] is False
    assert row["pass_to_pass_failing_at_base"] == task["FAIL_TO_PASS"]
