"""Noisy neighbours: a fork bomb + memory hog + output flood in one of four sandboxes.

The other three keep their median bash latency within 2x of their median in quiet windows
(interleaved with the noisy ones, so the machine's other load affects both alike), the noisy
sandbox is killed by the watchdog and comes back usable, and the node process keeps running.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sbx_helpers import json_lines, need_runtime

COMBOS = [
    pytest.param("bwrap", "root", marks=pytest.mark.sandbox, id="bwrap-root"),
    pytest.param("bwrap", "user", marks=pytest.mark.sandbox, id="bwrap-user"),
    pytest.param("apptainer", "user", marks=pytest.mark.apptainer, id="apptainer-user"),
]


@pytest.mark.parametrize(("runtime", "who"), COMBOS)
def test_noisy_neighbours(runtime: str, who: str, request: pytest.FixtureRequest) -> None:
    need_runtime(runtime)
    runner: Callable = request.getfixturevalue("as_root" if who == "root" else "as_user")
    proc = runner("noisy.py", runtime, timeout=600)
    (report,) = json_lines(proc)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["noise"]["watchdog_kills"] >= 1, report
    assert report["noisy_sandbox_after"] == "alive\n", report
    for normal, noisy in zip(report["normal_ms"], report["noisy_ms"], strict=True):
        assert noisy <= 2 * normal, f"median latency {noisy:.2f} ms under noise vs {normal:.2f} ms normal: {report}"
