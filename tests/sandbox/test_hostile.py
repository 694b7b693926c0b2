"""Hostile input, for every runtime here, as root and as an unprivileged user.

Each (runtime, user) combination runs ``hostile.py`` once in a subprocess (the very same code
for root and, as :class:`tests.unprivileged.CiUser`, for the CI user); each check is reported as its own test. Checks that
need isolation do not apply to the local runtime (it has none, by design).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.sandbox.sbx_helpers import json_lines, need_runtime

# one test at a time (scripts/test.sh): its checks look for survivors among every process on the machine
pytestmark = pytest.mark.serial

ALL = ["network", "write_outside", "read_home", "env_secret", "fork_bomb", "memory_hog", "endless_output",
       "sleep_forever", "kill_tool_server", "background_left_behind", "file_tool_symlinks"]
LOCAL = ["env_secret", "memory_hog", "endless_output", "sleep_forever", "kill_tool_server",
         "background_left_behind", "file_tool_symlinks"]
COMBOS = [
    pytest.param("bwrap", "root", marks=pytest.mark.sandbox, id="bwrap-root"),
    pytest.param("bwrap", "user", marks=pytest.mark.sandbox, id="bwrap-user"),
    pytest.param("apptainer", "root", marks=pytest.mark.apptainer, id="apptainer-root"),
    pytest.param("apptainer", "user", marks=pytest.mark.apptainer, id="apptainer-user"),
    pytest.param("local", "root", marks=pytest.mark.sandbox, id="local-root"),
    pytest.param("local", "user", marks=pytest.mark.sandbox, id="local-user"),
]
_results: dict[tuple[str, str], dict[str, dict]] = {}


def results(runtime: str, who: str, runner: Callable) -> dict[str, dict]:
    if (runtime, who) not in _results:
        proc = runner("hostile.py", runtime, timeout=600)
        _results[runtime, who] = {r["check"]: r for r in json_lines(proc)}
    return _results[runtime, who]


CASES = [pytest.param(*combo.values, check, marks=combo.marks, id=f"{combo.id}-{check}")
         for combo in COMBOS for check in (LOCAL if combo.values[0] == "local" else ALL)]


@pytest.mark.parametrize(("runtime", "who", "check"), CASES)
def test_hostile(runtime: str, who: str, check: str, request: pytest.FixtureRequest) -> None:
    need_runtime(runtime)
    runner = request.getfixturevalue("as_root" if who == "root" else "as_user")
    report = results(runtime, who, runner).get(check)
    assert report is not None, f"check {check} did not report"
    assert report["passed"], report["detail"]
