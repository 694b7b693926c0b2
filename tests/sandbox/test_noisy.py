"""Noisy neighbours: a fork bomb + memory hog + output flood in one of four sandboxes.

The other three keep their median bash latency within 3x of their median in quiet windows
(interleaved with the noisy ones, so the machine's other load affects both alike), the noisy
sandbox is killed by the watchdog, comes back usable and demoted (its scheduler autogroup at
nice 19, the quiet ones at 0), and the node process keeps running.

The latency bound is loose on purpose: what slows the neighbours on a 2-core machine is the noise's
first fraction of a second (a fork bomb forking to RLIMIT_NPROC, 1.4 GB being faulted in) before the
watchdog's scan kills it, kernel work that no CPU weight controls. Measured ratios: bwrap 0.93-1.05,
apptainer 0.95-1.84 here, 2.04 once in CI; without the demotion the same range (so the demotion is
checked directly, through the autogroup, not through latency).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.sandbox.sbx_helpers import json_lines, need_runtime

# one test at a time (scripts/test.sh): its neighbours' latency is measured against its own quiet windows
pytestmark = pytest.mark.serial

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
    if Path("/proc/self/autogroup").exists() and Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
        assert all(g.endswith("nice 19") for g in report["noisy_autogroup"]), report
        assert all(g.endswith("nice 0") for g in report["quiet_autogroup"]), report
    for normal, noisy in zip(report["normal_ms"], report["noisy_ms"], strict=True):
        assert noisy <= 3 * normal, f"median latency {noisy:.2f} ms under noise vs {normal:.2f} ms normal: {report}"
