"""Reading the EVAL runner's out-of-band results (see :mod:`rollout_node.tasks.evalrunner`).

Guarantees:
- Only a frame whose HMAC-SHA256 under this run's key verifies counts; the last such frame wins.
  Text the code under test prints (imitation reports, frames with a guessed tag, results after the
  runner finished) cannot verify, because the key never left the runner's memory.
- :func:`read_results` never raises: no frame, a frame cut short or a frame that does not verify
  give no outcomes and a named flag (``results: missing|truncated|forged``), which forces reward 0.
- Violations the runner recorded (refused audit events and imports, runner objects modified,
  plugins from the tree) come back as ``tamper: ...`` flags, which force reward 0 too.
- Outcomes follow SWE-bench's convention: XFAIL counts as PASSED, XPASS as FAILED; a failing
  setup or teardown is ERROR; a file that failed to collect makes its tests ERROR.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from pathlib import Path

from rollout_node.tasks.parsers import outcomes_from

SOURCE = Path(__file__).with_name("evalrunner.py").read_text()
TAG = "spoolrl-results-v1"
_HEADER = re.compile(rf"^{TAG} (?P<mac>[0-9a-f]{{64}}) (?P<len>\d{{1,10}})$", re.M)
_PHASE_RANK = {"setup": 0, "call": 1, "teardown": 2}


@dataclass(frozen=True)
class RunnerResults:
    """Outcomes per test id, plus the flags that force reward 0."""

    outcomes: dict[str, str] = field(default_factory=dict)
    flags: tuple[str, ...] = ()


def read_results(log: str, key: bytes, tests: tuple[str, ...]) -> RunnerResults:
    """The verified frame in ``log`` -> outcomes of ``tests`` (MISSING when absent) and flags."""
    body, problems = _verified_body(log, key)
    if body is None:
        return RunnerResults({t: "MISSING" for t in tests}, tuple(f"results: {p}" for p in problems))
    found, broken, violations, ended = _decode(body)
    flags = [f"results: {p}" for p in problems] + [f"tamper: {v}" for v in violations]
    if not ended:
        flags.append("results: truncated (no end record)")
    return RunnerResults(outcomes_from(tests, found, broken, "pytest"), tuple(flags))


def _verified_body(log: str, key: bytes) -> tuple[str | None, list[str]]:
    """The body of the last frame that verifies, and what is wrong with the others (any is a flag)."""
    headers = list(_HEADER.finditer(log))
    verified: str | None = None
    forged = cut = 0
    for m in headers:
        start, size = m.end() + 1, int(m["len"])
        body = log[start:start + size]
        mac = hmac.new(key, body.encode("ascii", "replace"), hashlib.sha256).hexdigest()
        if len(body) == size and hmac.compare_digest(mac, m["mac"]):
            verified = body
        elif len(body) < size and verified is None:
            cut += 1
        else:
            forged += 1
    problems = [f"forged ({forged} result frame(s) in the output that do not verify)"] if forged else []
    if verified is None:
        problems.append("truncated (the result frame was cut short)" if cut else
                        "missing (the runner's result frame is not in the output)")
    return verified, problems


def _decode(body: str) -> tuple[dict[str, str], set[str], list[str], bool]:
    phases: dict[str, dict[str, tuple[str, bool]]] = {}
    broken: set[str] = set()
    violations: list[str] = []
    ended = False
    for line in body.splitlines():
        parts = line.split(" ")
        try:
            if parts[0] == "R" and len(parts) == 5:
                phases.setdefault(_unhex(parts[4]), {})[parts[1]] = (parts[2], parts[3] == "1")
            elif parts[0] == "C" and len(parts) == 3:
                broken.add(_unhex(parts[2]))
            elif parts[0] == "V" and len(parts) == 2:
                violations.append(_unhex(parts[1]))
            elif parts[0] == "E":
                ended = True
        except ValueError:
            violations.append(f"unreadable result line {line[:80]!r}")
    return {test: _outcome(p) for test, p in phases.items()}, broken, violations, ended


def _unhex(text: str) -> str:
    return bytes.fromhex(text).decode("utf-8", "replace")


def _outcome(phases: dict[str, tuple[str, bool]]) -> str:
    """One test's phases (setup/call/teardown -> (outcome, was xfail)) -> its outcome."""
    for when in ("setup", "teardown"):
        outcome, xfail = phases.get(when, ("passed", False))
        if outcome == "failed":
            return "ERROR"
        if when == "setup" and outcome == "skipped":
            return "PASSED" if xfail else "SKIPPED"
    if "call" not in phases:
        return "ERROR"
    outcome, xfail = phases["call"]
    if outcome == "passed":
        return "FAILED" if xfail else "PASSED"  # an unexpected pass (XPASS) is not a fix
    if outcome == "skipped":
        return "PASSED" if xfail else "SKIPPED"
    return "FAILED"
