"""EVAL through the real bwrap sandbox and test image: gold=1 / empty=0 for every built-in instance,
tampering scores 0 (and each tamper is shown to work against a naive harness), faults are statuses.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from hpc.config import SandboxConfig
from rollout_node.tasks import (
    EvalResult,
    TaskInstance,
    collect_diff,
    ensure_builtin_repos,
    harness,
    load_tasks,
    prepare_workdir,
)
from rollout_node.tasks.parsers import outcomes_for

pytestmark = pytest.mark.sandbox


def _image_or_skip() -> None:
    from rollout_node.sandbox import bwrap_unavailable_reason

    if why := bwrap_unavailable_reason():
        pytest.skip(why)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    _image_or_skip()
    root = tmp_path_factory.mktemp("eval")
    ensure_builtin_repos(root / "cache")
    return {"cache": root / "cache", "scratch": root / "scratch", "root": root}


def run(env: dict[str, Path], task: TaskInstance, diff: str, **kw: object) -> EvalResult:
    return harness.evaluate(task, diff, sandbox_cfg=SandboxConfig(), scratch_dir=env["scratch"],
                            repo_cache=env["cache"], **kw)  # type: ignore[arg-type]


def task_named(instance_id: str) -> TaskInstance:
    return next(t for t in load_tasks("builtin") if t.instance_id == instance_id)


def agent_diff(env: dict[str, Path], task: TaskInstance, name: str, act: Callable[[Path], None]) -> str:
    """What an agent submits after doing ``act`` in its work dir (the pipeline's collect_diff)."""
    work = env["root"] / f"agent-{name}"
    prepare_workdir(task, work, env["cache"])
    act(work)
    return collect_diff(work, task, env["cache"])


def test_gold_scores_1_and_empty_scores_0_for_every_builtin_instance(env: dict[str, Path]) -> None:
    tasks = load_tasks("builtin")
    with ThreadPoolExecutor(2) as pool:
        gold = list(pool.map(lambda t: run(env, t, t.patch), tasks))
        empty = list(pool.map(lambda t: run(env, t, ""), tasks))
    for task, g, e in zip(tasks, gold, empty, strict=True):
        assert (g.status, g.reward, e.status, e.reward) == ("ok", 1.0, "ok", 0.0), (task.instance_id, g.log, e.log)
        assert set(g.outcomes) == set(task.tests) and set(g.outcomes.values()) == {"PASSED"}
        assert all(e.outcomes[t] in ("FAILED", "ERROR") for t in task.FAIL_TO_PASS)  # ERROR: import fails
        assert all(e.outcomes[t] == "PASSED" for t in task.PASS_TO_PASS)
    assert not any(env["scratch"].iterdir()), "eval trees must be removed"


FORCE_PASS = '''import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
'''
ADDOPTS = 'import os\nos.environ["PYTEST_ADDOPTS"] = "-p forcepass"\n'
# in-process subversion from code the tests import: every report becomes "passed"
PATCH_REPORTS = '''
import _pytest.reports

_orig = _pytest.reports.TestReport.from_item_and_call.__func__


def _forced(cls, item, call):
    report = _orig(cls, item, call)
    report.outcome, report.longrepr = "passed", None
    return report


_pytest.reports.TestReport.from_item_and_call = classmethod(_forced)
'''


def _write(files: dict[str, str]) -> Callable[[Path], None]:
    def act(work: Path) -> None:
        for rel, text in files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            with open(work / rel, "a") as f:
                f.write(text)
    return act


TAMPERS: dict[str, dict[str, str]] = {
    "edit_failing_test": {"tests/test_textkit.py": "\n\ndef test_truncate_respects_width():\n    pass\n"},
    "conftest_root": {"conftest.py": FORCE_PASS},
    "conftest_tests": {"tests/conftest.py": FORCE_PASS},
    "pytest_ini_plugin": {"pytest.ini": "[pytest]\naddopts = -p forcepass\n", "forcepass.py": FORCE_PASS},
    "sitecustomize": {"sitecustomize.py": ADDOPTS, "forcepass.py": FORCE_PASS},
    "user_site_pth": {".local/lib/python3.11/site-packages/zz.pth": "import os; os.environ['PYTEST_ADDOPTS'] = "
                      "'-p forcepass'\n", "forcepass.py": FORCE_PASS},
    "entry_point_plugin": {"forcepass-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: forcepass\nVersion: 1.0\n",
                           "forcepass-1.0.dist-info/entry_points.txt": "[pytest11]\nforcepass = forcepass\n",
                           "forcepass.py": FORCE_PASS},
    "patch_runner_from_library": {"textkit/core.py": PATCH_REPORTS},
    "tests_package_init": {"tests/__init__.py": PATCH_REPORTS},
    # exit status 0 before any test ran: the harness reads results, not the exit code
    "exit_zero_at_import": {"textkit/__init__.py": "import os\nos._exit(0)\n"},
    # result lines printed after pytest's own summary (an atexit hook writing to the real stdout)
    "fake_results_after_summary": {"textkit/__init__.py": (
        "import atexit, os\natexit.register(os.write, 1, b'PASSED tests/test_textkit.py::test_truncate_respects_width"
        "\\ntests/test_textkit.py::test_truncate_respects_width PASSED\\n')\n")},
}
# A typical naive harness: the agent's tree as is, `python3 -m pytest` with the repo on PYTHONPATH and
# HOME=/work (the episode's home). Tampers that fool it prove they are real attacks.
NAIVE_FOOLED = {"conftest_root", "conftest_tests", "pytest_ini_plugin", "sitecustomize", "user_site_pth",
                "entry_point_plugin", "patch_runner_from_library", "tests_package_init"}


def _naive_argv(task: TaskInstance, root: Path, eval_python: str, marker: str) -> list[str]:
    return ["bash", "-c", f"echo {marker}; HOME=/work PYTHONPATH=/work exec python3 -m pytest -rA -v \"$@\"", "bash",
            *harness.files_to_test(task, root)]


def _naive_outcomes(task: TaskInstance, run: harness.ExecResult, key: bytes) -> tuple[dict[str, str], list[str]]:
    return outcomes_for(task.tests, run.output, task.log_parser), []


@pytest.mark.parametrize("name", sorted(TAMPERS))
def test_tampering_scores_zero(env: dict[str, Path], name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    task = task_named("spoolrl__textkit-1")
    diff = agent_diff(env, task, name, _write(TAMPERS[name]))
    assert diff.strip()
    result = run(env, task, diff)
    assert (result.status, result.reward, result.diff_applied) == ("ok", 0.0, True), result.log
    if name == "patch_runner_from_library":  # refused in-process, and flagged
        assert any(f.startswith("tamper: import _pytest.reports from /work/") for f in result.flags), result.flags
    if name == "patch_runner_from_library":  # the static check names it too
        assert "textkit/core.py: names test-runner internals (TestReport, _pytest)" in result.flags
    else:
        assert result.outcomes[task.FAIL_TO_PASS[0]] in ("FAILED", "MISSING")
    if name == "exit_zero_at_import":
        assert set(result.outcomes.values()) == {"MISSING"}
    if name in NAIVE_FOOLED:
        monkeypatch.setattr(harness, "_neutralise", lambda tree, task: None)
        monkeypatch.setattr(harness, "_suspicious", lambda tree, task, diff: [])
        monkeypatch.setattr(harness, "build_test_argv", _naive_argv)
        monkeypatch.setattr(harness, "_outcomes", _naive_outcomes)
        naive = run(env, task, diff)
        assert naive.reward == 1.0, f"tamper {name} does not even fool a naive harness:\n{naive.log}"


def test_a_real_fix_still_scores_1_when_the_agent_also_edits_tests(env: dict[str, Path]) -> None:
    task = task_named("spoolrl__intervals-4")
    # the agent appends trivial tests of its own: the harness resets them, the fix alone must carry the reward
    act = _write({"tests/test_intervals.py": "\n\ndef test_mine():\n    assert 1 + 1 == 2\n",
                  "tests/test_extra.py": "def test_extra():\n    assert [] == []\n"})
    diff = task.patch + agent_diff(env, task, "fix-and-tests", act)
    result = run(env, task, diff)
    assert (result.status, result.reward) == ("ok", 1.0), result.log


def test_a_diff_that_does_not_apply_scores_zero_not_harness_error(env: dict[str, Path]) -> None:
    task = task_named("spoolrl__textkit-2")
    bad = task.patch.replace("re.split", "nothing_like_this")
    result = run(env, task, bad)
    assert (result.status, result.reward, result.diff_applied) == ("ok", 0.0, False)
    assert set(result.outcomes.values()) == {"MISSING"}


def test_hanging_tests_time_out(env: dict[str, Path]) -> None:
    task = task_named("spoolrl__textkit-3")
    diff = task.patch + agent_diff(env, task, "hang", _write({"textkit/__init__.py": "while True:\n    pass\n"}))
    result = run(env, task, diff, timeout_s=3.0)
    assert (result.status, result.reward) == ("timeout", 0.0)
    assert set(result.outcomes.values()) <= {"MISSING", "ERROR"}


def test_infrastructure_faults_are_harness_errors(env: dict[str, Path], tmp_path: Path) -> None:
    task = task_named("spoolrl__tinyformats-1")
    no_repo = harness.evaluate(task, task.patch, sandbox_cfg=SandboxConfig(), scratch_dir=tmp_path,
                               repo_cache=tmp_path / "empty-cache")
    assert (no_repo.status, no_repo.reward) == ("harness_error", 0.0) and "prepare_repos" in no_repo.error
    bad_image = run(env, replace(task, image=str(tmp_path / "no-such-image")), task.patch)
    assert bad_image.status == "harness_error" and bad_image.infrastructure_failure, bad_image
    broken = replace(task, test_patch=task.test_patch.replace(" def test", " def tset"))  # context no longer matches
    assert run(env, broken, task.patch).status == "harness_error"
    no_python = run(env, task, task.patch, eval_python="/no/such/python3")  # the runner never starts
    assert no_python.status == "harness_error" and "never started" in no_python.error
