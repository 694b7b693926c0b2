"""A rollout node SIGKILLed with a hostile sandbox process running: does anything of the sandbox survive?

Usage: ``python orphan_node.py`` -> one JSON line ``{"case": ..., "before": [...], "left": [...]}`` per
case. Run as an unprivileged user (no pids-cgroup sweep then), it plays three roles:

- ``running``: a node process opens a real bwrap sandbox, starts in its shell a process that
  double-forks, calls setsid and ignores every catchable signal, and is SIGKILLed by this script;
- ``race``: a node process starts a launcher exactly as the sandbox does (``spawner.launcher_prefix()``
  in front of the bwrap argv) but delayed by a sleep the test puts in front, and is SIGKILLed before
  the launcher runs: the window in which bwrap's own ``--die-with-parent`` is not yet set;
- ``race-untethered``: the same without the tether: the sandbox survives its node (the window is real,
  and the same as the one inside bwrap, between its clone and its own ``--die-with-parent``); then
  ``sweep_orphans`` (what the next node runs at its first sandbox) must kill it.

``before`` lists the hostile processes seen before the kill, ``left`` every process still naming the
case's work dir or token ``SETTLE_S`` after the kill (after the race's delay), ``swept`` what the
sweep killed and ``after_sweep`` what is left then.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpc.config.sandbox import SandboxConfig
from rollout_node.sandbox import default_image, open_sandbox, spawner
from rollout_node.sandbox.runtimes import BwrapRuntime, LaunchSpec
from rollout_node.sandbox.sandbox import ENV_MARKER, sweep_orphans

HOSTILE = "trap '' HUP INT QUIT TERM USR1 USR2 PIPE ALRM; while :; do sleep 1; done"
RACE_DELAY_S = 1.0
SETTLE_S = 2.0  # the kernel's kills and init's reaping, on a loaded host


def hostile_command(token: str) -> str:
    """Two daemons: double-forked and setsid, ignoring signals, named by ``token`` (their $0)."""
    daemon = f"setsid sh -c {json.dumps(HOSTILE)} hostile-{token}"
    return f"( {daemon} & ) ; ( ( {daemon} & ) & ) ; sleep 0.5; echo started"


def matching(needles: list[str]) -> list[str]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(n in cmd for n in needles):
            found.append(f"{name} {cmd[:120]}")
    return found


def node_running(workdir: Path, token: str) -> None:
    sb = open_sandbox(SandboxConfig(runtime="bwrap", command_timeout_s=30.0), workdir)
    result = sb.run(hostile_command(token))
    print(json.dumps({"ready": result.output.strip()}), flush=True)
    time.sleep(600)  # until killed


def node_race(workdir: Path, token: str, tethered: bool) -> None:
    spec = LaunchSpec(workdir=workdir, image=Path(default_image()), scratch=workdir,
                      env={ENV_MARKER: f"sbx-{os.getpid()}-{token}"})  # the key a Sandbox gives its launches
    prefix = spawner.launcher_prefix() if tethered else spawner.default_signals()
    argv = ["/bin/sh", "-c", f'sleep {RACE_DELAY_S}; exec "$@"', "sh", *prefix,
            *BwrapRuntime().argv(spec, ["/bin/sh", "-c", HOSTILE, f"hostile-{token}"])]
    spawner.spawn(lambda: subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True))
    print(json.dumps({"ready": "launcher started"}), flush=True)
    time.sleep(600)


def run_case(case: str) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix="orphan-"))
    token = secrets.token_hex(6)
    node = subprocess.Popen([sys.executable, __file__, case, str(workdir), token], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    assert node.stdout is not None
    ready = node.stdout.readline()
    before = matching([f"hostile-{token}"])
    os.kill(node.pid, signal.SIGKILL)
    node.wait()
    time.sleep(SETTLE_S + (RACE_DELAY_S if case != "running" else 0.0))
    left = matching([str(workdir), token])
    swept = sweep_orphans()
    time.sleep(SETTLE_S if swept else 0.0)
    after = matching([str(workdir), token])
    for line in after:  # never leave a test's process behind, whatever the outcome
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split()[0]), signal.SIGKILL)
    shutil.rmtree(workdir, ignore_errors=True)
    return {"case": case, "ready": ready.strip(), "before": before, "left": left, "swept": swept,
            "after_sweep": after}


def main() -> None:
    if len(sys.argv) > 1:
        workdir, token = Path(sys.argv[2]), sys.argv[3]
        if sys.argv[1] == "running":
            node_running(workdir, token)
        else:
            node_race(workdir, token, tethered=sys.argv[1] == "race")
        return
    for case in ("running", "race", "race-untethered"):
        print(json.dumps(run_case(case)), flush=True)


if __name__ == "__main__":
    main()
