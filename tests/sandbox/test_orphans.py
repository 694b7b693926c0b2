"""A rollout node SIGKILLed as an unprivileged user leaves no sandbox process behind (issue 37).

Root has a pids-cgroup sweep for orphaned sandboxes; an unprivileged node has none, so the launcher
itself must die with the node: ``spawner.launcher_prefix`` sets the parent-death signal before bwrap
runs and refuses to start a sandbox whose node is already gone. ``orphan_node.py`` runs as the CI
user and kills a node (a) while a double-forked, setsid, signal-ignoring process runs in its sandbox,
(b) in the window before bwrap's own ``--die-with-parent`` (a test-made delay), and (c) in that window
without the tether, which must leave the sandbox running (the window is real: bwrap's clone child has
one like it) until ``sweep_orphans``, which the next node runs at its first sandbox, kills it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.sandbox.sbx_helpers import json_lines, need_runtime

pytestmark = pytest.mark.sandbox


def test_sigkilled_unprivileged_node_leaves_no_sandbox_process(
        as_user: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    need_runtime("bwrap")
    proc = as_user("orphan_node.py", timeout=120)
    cases = {c["case"]: c for c in json_lines(proc)}
    assert set(cases) == {"running", "race", "race-untethered"}, proc.stderr[-3000:]
    running = cases["running"]
    assert "started" in running["ready"] and len(running["before"]) == 2, running
    assert running["left"] == [], running
    for case in ("race", "race-untethered"):
        assert "launcher started" in cases[case]["ready"], cases[case]
    assert cases["race"]["left"] == [], cases["race"]
    untethered = cases["race-untethered"]
    assert any("hostile-" in line for line in untethered["left"]), untethered
    assert untethered["swept"] and untethered["after_sweep"] == [], untethered


def test_python_tether_execs_only_under_the_expected_parent() -> None:
    """The fallback where setpriv lacks --pdeathsig: exec under the right parent, exit 125 otherwise,
    with SIGKILL (9) as the parent-death signal either way."""
    from rollout_node.sandbox.spawner import _TETHER_SHIM
    shim = [sys.executable, "-S", "-c", _TETHER_SHIM]
    probe = [sys.executable, "-c", "import ctypes; s = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(s)); "
             "print(s.value)"]  # PR_GET_PDEATHSIG
    ok = subprocess.run([*shim, str(os.getpid()), *probe], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.strip() == "9", ok
    orphan = subprocess.run([*shim, "1", "echo", "started"], capture_output=True, text=True, timeout=60)
    assert orphan.returncode == 125 and "started" not in orphan.stdout, orphan
