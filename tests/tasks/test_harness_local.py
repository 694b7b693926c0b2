"""Harness logic without an image (the tiny local stand-in from standin.py runs the tests on the host
with this venv's pytest): gold/empty on one instance, and the reset of PASS_TO_PASS test files.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hpc.config import SandboxConfig
from rollout_node.tasks import EvalResult, TaskInstance, collect_diff, ensure_builtin_repos, load_tasks, prepare_workdir
from rollout_node.tasks.harness import evaluate

sys.path.insert(0, str(Path(__file__).parent))
from standin import open_standin  # noqa: E402


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cache")
    ensure_builtin_repos(path)
    return path


def score(task: TaskInstance, diff: str, cache: Path, scratch: Path) -> EvalResult:
    return evaluate(task, diff, sandbox_cfg=SandboxConfig(), scratch_dir=scratch, repo_cache=cache,
                    eval_python=sys.executable, opener=open_standin)


def test_gold_and_empty_with_the_standin(cache: Path, tmp_path: Path) -> None:
    task = next(t for t in load_tasks("builtin") if t.instance_id == "spoolrl__tinyformats-2")
    assert score(task, task.patch, cache, tmp_path).reward == 1.0
    empty = score(task, "", cache, tmp_path)
    assert (empty.status, empty.reward) == ("ok", 0.0)
    assert empty.outcomes == {**dict.fromkeys(task.FAIL_TO_PASS, "FAILED"), **dict.fromkeys(task.PASS_TO_PASS, "PASSED")}


def test_pass_to_pass_files_are_reset_even_when_the_test_patch_does_not_touch_them(cache: Path, tmp_path: Path) -> None:
    """The agent fixes the bug, breaks merge()'s sorting and rewrites the PASS_TO_PASS test that notices."""
    base = next(t for t in load_tasks("builtin") if t.instance_id == "spoolrl__intervals-4")
    new_test = "tests/test_merge_more.py"
    test_patch = (f"diff --git a/{new_test} b/{new_test}\nnew file mode 100644\n--- /dev/null\n+++ b/{new_test}\n"
                  "@@ -0,0 +1,5 @@\n+from intervals import Interval, merge\n+\n+\n+def test_enclosing():\n"
                  "+    assert merge([Interval(1, 10), Interval(2, 3)]) == [Interval(1, 10)]\n")
    task = replace(base, test_patch=test_patch, FAIL_TO_PASS=(f"{new_test}::test_enclosing",),
                   PASS_TO_PASS=("tests/test_intervals.py::test_merge_overlapping",))
    assert score(task, task.patch, cache, tmp_path).reward == 1.0
    work = tmp_path / "agent"
    prepare_workdir(task, work, cache)
    code, tests = work / "intervals" / "interval.py", work / "tests" / "test_intervals.py"
    code.write_text(code.read_text().replace("iv.end)\n", "max(merged[-1].end, iv.end))\n")
                    .replace("for iv in sorted(intervals):", "for iv in intervals:"))
    tests.write_text(tests.read_text().replace("assert merge([Interval(2, 5)", "assert not merge([Interval(2, 5)"))
    result = score(task, collect_diff(work, task, cache), cache, tmp_path)
    assert result.outcomes == {f"{new_test}::test_enclosing": "PASSED",
                               "tests/test_intervals.py::test_merge_overlapping": "FAILED"}
    assert result.reward == 0.0


def test_runner_internals_flag_spares_repositories_that_use_them(tmp_path: Path) -> None:
    """A diff naming test-runner internals is flagged (reward 0) unless the repo's own code names them."""
    from rollout_node.tasks.repos import materialise
    src = tmp_path / "src"
    (src / "plug").mkdir(parents=True)
    (src / "tests").mkdir()
    (src / "plug" / "__init__.py").write_text("")
    (src / "plug" / "core.py").write_text("def add(a, b):\n    return a - b\n")
    (src / "plug" / "hooks.py").write_text("HOOKS = {}  # our own hookimpl markers\n")
    (src / "tests" / "test_core.py").write_text("from plug.core import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n")
    cache = tmp_path / "cache"
    base = materialise(src, cache / "acme__plug.git", "acme/plug")
    test_patch = ("diff --git a/tests/test_core.py b/tests/test_core.py\n--- a/tests/test_core.py\n"
                  "+++ b/tests/test_core.py\n@@ -3,3 +3,7 @@ from plug.core import add\n \n def test_zero():\n"
                  "     assert add(0, 0) == 0\n+\n+\n+def test_add():\n+    assert add(2, 3) == 5\n")
    task = TaskInstance(instance_id="acme__plug-1", repo="acme/plug", base_commit=base, patch="", test_patch=test_patch,
                        FAIL_TO_PASS=("tests/test_core.py::test_add",), PASS_TO_PASS=("tests/test_core.py::test_zero",))

    def fix(extra: str) -> str:
        work = tmp_path / f"work-{abs(hash(extra))}"
        prepare_workdir(task, work, cache)
        (work / "plug" / "core.py").write_text(f"def add(a, b):\n    return a + b\n{extra}")
        return collect_diff(work, task, cache)

    clean = score(task, fix("# registers a hookimpl\n"), cache, tmp_path)
    assert (clean.reward, clean.flags) == (1.0, ())
    flagged = score(task, fix("import _pytest  # noqa\n"), cache, tmp_path)
    assert flagged.outcomes[task.FAIL_TO_PASS[0]] == "ERROR", "the import is refused in-process"
    assert flagged.reward == 0.0
    assert flagged.flags[0] == "plug/core.py: names test-runner internals (_pytest)"
    assert any(f.startswith("tamper: import _pytest from ") for f in flagged.flags), flagged.flags


def test_unexpected_runtime_faults_become_harness_errors(cache: Path, tmp_path: Path) -> None:
    class Broken(RuntimeError):
        pass

    def opener(*args: object, **kwargs: object) -> object:
        raise Broken("the runtime fell over")

    task = load_tasks("builtin")[0]
    result = evaluate(task, task.patch, sandbox_cfg=SandboxConfig(), scratch_dir=tmp_path, repo_cache=cache,
                      opener=opener)  # type: ignore[arg-type]
    assert (result.status, result.reward) == ("harness_error", 0.0) and "the runtime fell over" in result.error
    assert not any(tmp_path.iterdir())
