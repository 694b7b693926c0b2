"""Noisy neighbours: four sandboxes, one runs a fork bomb + memory hog + output flood.

Usage: python noisy.py RUNTIME [--rounds N]  ->  one JSON object: per quiet sandbox the median
bash latency in quiet windows (normal) and in noisy windows, interleaved three times, how often the noisy sandbox was killed
by the watchdog, and the node's own state. Run by test_noisy.py as root and as an unprivileged
user. Medians over many commands make the comparison robust to other load on the machine.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

from hpc.config.sandbox import SandboxConfig
from rollout_node.sandbox import open_sandbox
from rollout_node.sandbox.sandbox import Sandbox

RUNTIME: Any = sys.argv[1] if len(sys.argv) > 1 else "bwrap"
ROUNDS = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 8
CYCLES = 6
COMMAND = "ls /etc > /dev/null"
NOISE = ("(:(){ :|:& };:) 2>/dev/null & "
         "python3 -c 'import time; b = b\"x\" * (700 << 20); time.sleep(60)' & "
         "python3 -c 'import time; b = b\"x\" * (700 << 20); time.sleep(60)' & "
         "yes noise")


def latencies(quiet: list[Sandbox], rounds: int) -> list[list[float]]:
    out: list[list[float]] = [[] for _ in quiet]
    for _ in range(rounds):
        for i, sb in enumerate(quiet):
            t0 = time.perf_counter()
            r = sb.run(COMMAND, timeout_s=30)
            out[i].append((time.perf_counter() - t0) * 1000)
            assert r.exit_code == 0, r
    return out


def autogroup(sb: Sandbox) -> str:
    """The scheduler autogroup line of the sandbox shell's launcher, read from the host ("" without autogroup)."""
    pid = sb.shell.pid
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().strip()
    except OSError:
        return ""


def noise_loop(sb: Sandbox, stop: threading.Event, report: dict) -> None:
    while not stop.is_set():
        r = sb.run(NOISE, timeout_s=2)
        report["runs"] += 1
        report["watchdog_kills"] += "watchdog" in r.output
        report["flood_bytes"] += r.total_bytes


def main() -> None:
    cfg = SandboxConfig(runtime=cast(Any, RUNTIME), allow_local=RUNTIME == "local", mem_gb=1.0, max_procs=64,
                        max_output_kb=16)
    scratch = tempfile.TemporaryDirectory(prefix="noisy-", ignore_cleanup_errors=True)  # removed at exit
    sbs = [open_sandbox(cfg, Path(tempfile.mkdtemp(dir=scratch.name))) for _ in range(4)]
    noisy, quiet = sbs[0], sbs[1:]
    latencies(quiet, 5)  # warm up
    normal: list[list[float]] = [[] for _ in quiet]
    during: list[list[float]] = [[] for _ in quiet]
    report = {"runs": 0, "watchdog_kills": 0, "flood_bytes": 0}
    demotion: list[str] = []
    # Interleaved quiet and noisy windows: a change in the machine's other load hits both alike.
    for _ in range(CYCLES):
        for i, lat in enumerate(latencies(quiet, ROUNDS)):
            normal[i] += lat
        stop = threading.Event()
        thread = threading.Thread(target=noise_loop, args=(noisy, stop, report), daemon=True)
        thread.start()
        time.sleep(0.3)  # let the noise build up
        for i, lat in enumerate(latencies(quiet, ROUNDS)):
            during[i] += lat
        stop.set()
        thread.join(30)
        noisy.run("true", timeout_s=30)  # a fresh shell in the penalty box: demoted at the watchdog's next scan
        time.sleep(0.5)
        demotion.append(autogroup(noisy))
    alive = noisy.run("echo alive", timeout_s=30).output
    quiet_groups = [autogroup(sb) for sb in quiet]
    for sb in sbs:
        sb.close()
    print(json.dumps({
        "runtime": RUNTIME, "command": COMMAND, "rounds": ROUNDS * CYCLES,
        "normal_ms": [statistics.median(x) for x in normal],
        "noisy_ms": [statistics.median(x) for x in during],
        "noise": report, "noisy_sandbox_after": alive, "noisy_autogroup": demotion,
        "quiet_autogroup": quiet_groups, "noise_thread_done": not thread.is_alive(),
    }))


if __name__ == "__main__":
    main()
