"""Test-log parsers: a test run's text output -> ``{test id: outcome}``.

Guarantees:
- Outcomes are one of :data:`OUTCOMES`. ``PASSED`` covers pytest's PASSED and XFAIL and unittest's
  ``ok`` and ``expected failure`` (SWE-bench's convention); an unexpected success counts as FAILED.
  Tests absent from the log are not in the mapping (the harness marks them MISSING, or ERROR when
  their file or module failed to import).
- Parsers never raise on odd input: truncated logs, interleaved output, crashes and timeouts give
  whatever was reported before the end.
- pytest: when a ``short test summary info`` section (``-rA``) is present it is authoritative for
  the tests it lists (it is written after all captured output, so text printed by the code under
  test inside captured sections cannot pose as a result there); the live ``-v`` lines
  (``path::test PASSED [ 50%]``) fill in the rest, which keeps partial results of a crashed run.
- unittest (Django style): ``test_x (module.Class) ... ok`` lines, results on a later line after
  interleaved output, docstring descriptions, and the ``FAIL:``/``ERROR:`` headers of the failure
  report. Ids are normalised to ``test_x (module.Class)`` (Python 3.11 prints
  ``test_x (module.Class.test_x)``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

OUTCOMES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "MISSING")
_PYTEST_STATUS = {"PASSED": "PASSED", "XFAIL": "PASSED", "FAILED": "FAILED", "XPASS": "FAILED",
                  "ERROR": "ERROR", "SKIPPED": "SKIPPED"}
_PROGRESS = re.compile(r"^(?P<id>\S+::\S.*?) (?P<st>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?: \(.*\))?"
                       r"(?:\s+\[\s*\d+%\])?\s*$")
_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+\s*$")
_SUMMARY_LINE = re.compile(r"^(?P<st>PASSED|FAILED|ERROR|XFAIL|XPASS) (?P<rest>\S.*?)\s*$")
_FINAL_LINE = re.compile(r"^=+ .*(passed|failed|error|skipped|no tests ran|xfailed|xpassed|deselected).* =+\s*$")

_UT_STATUS = {"expected failure": "PASSED", "unexpected success": "FAILED", "FAIL": "FAILED", "ERROR": "ERROR",
              "ok": "PASSED"}  # longest first: results are matched as line suffixes
_UT_START = re.compile(r"^(?P<name>\w+) \((?P<where>[\w.]+)\)")
_UT_RESULT = re.compile(r" \.\.\. (?P<rest>.*)$")
_UT_HEADER = re.compile(r"^(?P<st>FAIL|ERROR): (?P<name>\w+) \((?P<where>[\w.]+)\)")


def parse_pytest(log: str) -> dict[str, str]:
    """Outcomes from pytest output run with ``-rA`` (summary) and/or ``-v`` (progress lines).

    With a summary, progress lines only add SKIPPED tests (the summary lists those without their
    id); without one (a crash or a timeout) the progress lines are all there is.
    """
    lines = log.splitlines()
    summary = _pytest_summary(lines)
    has_summary = any(_SUMMARY_HEADER.match(line) for line in lines)
    outcomes: dict[str, str] = {}
    for line in lines:
        m = _PROGRESS.match(line)
        if m and (not has_summary or m["st"] == "SKIPPED"):
            outcomes[m["id"]] = _PYTEST_STATUS[m["st"]]
    outcomes.update(summary)
    return outcomes


def _summary_id(rest: str) -> str:
    """The test id at the start of a summary line's rest (``id - message``; ids may hold ``[a - b]``)."""
    head = rest.split(" - ", 1)[0]
    bracket = head.find("[")
    if bracket < 0:
        return head
    depth = 0
    for i in range(bracket, len(rest)):
        depth += {"[": 1, "]": -1}.get(rest[i], 0)
        if depth == 0:
            return rest[: i + 1]
    return rest


def _pytest_summary(lines: list[str]) -> dict[str, str]:
    """The first ``short test summary info`` section, up to pytest's final ``=== N passed ===`` line."""
    found: dict[str, str] = {}
    start = next((i for i, line in enumerate(lines) if _SUMMARY_HEADER.match(line)), None)
    if start is None:
        return found
    for line in lines[start + 1:]:
        if _FINAL_LINE.match(line) or line.startswith("="):
            break
        m = _SUMMARY_LINE.match(line)
        if not m:
            continue
        test_id = _summary_id(m["rest"])
        if "::" in test_id:
            found[test_id] = _PYTEST_STATUS[m["st"]]
        elif m["st"] == "ERROR":  # a file that failed to import: "ERROR tests/test_x.py - ImportError"
            found[test_id.split(" ")[0]] = "ERROR"
    return found


def pytest_collection_errors(log: str) -> set[str]:
    """Files (or packages) that pytest could not import (``ERROR path`` or ``ERROR collecting path``)."""
    errors = {k for k, v in _pytest_summary(log.splitlines()).items() if v == "ERROR" and "::" not in k}
    errors.update(re.findall(r"^_+ ERROR collecting (\S+) _+\s*$", log, re.M))
    return errors


def normalise_unittest_id(name: str, where: str) -> str:
    """``test_x (mod.Class.test_x)`` (3.11+) and ``test_x (mod.Class)`` both -> ``test_x (mod.Class)``."""
    if where.endswith("." + name):
        where = where[: -len(name) - 1]
    return f"{name} ({where})"


def parse_unittest(log: str) -> dict[str, str]:
    """Outcomes from ``unittest -v`` / Django ``--verbosity 2`` output."""
    outcomes: dict[str, str] = {}
    pending: str | None = None  # a test whose " ... result" has not been seen yet
    for line in log.splitlines():
        start = _UT_START.match(line)
        if start:
            pending = normalise_unittest_id(start["name"], start["where"])
        if pending is None:
            continue
        result = _UT_RESULT.search(line)
        status = _ut_status(result["rest"] if result else line.strip())
        if status:
            outcomes[pending] = status
            pending = None
    for m in re.finditer(_UT_HEADER.pattern, log, re.M):
        outcomes[normalise_unittest_id(m["name"], m["where"])] = "FAILED" if m["st"] == "FAIL" else "ERROR"
    return outcomes


def _ut_status(text: str) -> str | None:
    """The status a result text ends with; output the test printed may precede it (``noiseok``).

    A wrongly read ``ok`` cannot hide a failure: the ``FAIL:``/``ERROR:`` report headers override.
    """
    text = text.strip()
    if text.startswith("skipped"):
        return "SKIPPED"
    for word, status in _UT_STATUS.items():
        if text.endswith(word):
            return status
    return None


def unittest_import_errors(log: str) -> set[str]:
    """Modules that failed to load (``unittest.loader._FailedTest`` entries)."""
    found = re.findall(r"^ERROR: (\w+) \((?:unittest\.loader\._FailedTest)(?:\.\w+)?\)", log, re.M)
    found += re.findall(r"^ImportError: Failed to import test module: ([\w.]+)", log, re.M)
    return set(found)


PARSERS: dict[str, Callable[[str], dict[str, str]]] = {"pytest": parse_pytest, "unittest": parse_unittest}


def canonical_test_id(test_id: str, parser: str) -> str:
    """The form a parser reports ``test_id`` in (unittest ids are normalised)."""
    if parser == "unittest":
        m = _UT_START.match(test_id)
        if m:
            return normalise_unittest_id(m["name"], m["where"])
    return test_id


def outcomes_for(tests: tuple[str, ...], log: str, parser: str) -> dict[str, str]:
    """Every test in ``tests`` -> its outcome; unreported tests are ERROR if their file/module failed, else MISSING."""
    found = PARSERS[parser](log)
    broken = pytest_collection_errors(log) if parser == "pytest" else unittest_import_errors(log)
    return outcomes_from(tests, found, broken, parser)


def outcomes_from(tests: tuple[str, ...], found: dict[str, str], broken: set[str], parser: str) -> dict[str, str]:
    """Every test in ``tests`` -> its outcome in ``found``; else ERROR if its file/module is ``broken``, else MISSING."""
    result = {}
    for test in tests:
        key = canonical_test_id(test, parser)
        if key in found:
            result[test] = found[key]
        elif _in_broken(key, broken, parser):
            result[test] = "ERROR"
        else:
            result[test] = "MISSING"
    return result


def _in_broken(test: str, broken: set[str], parser: str) -> bool:
    if parser == "pytest":
        path = test.split("::", 1)[0]
        return any(path == b or path.startswith(b.rstrip("/") + "/") for b in broken)
    m = _UT_START.match(test)
    module = m["where"] if m else test
    return any(module == b or module.startswith(b + ".") or module.endswith("." + b) for b in broken)
