"""Run as ``python ignored_signals.py WORKDIR``: with SIGINT and SIGQUIT ignored (as under
``nohup cmd &``), open a bwrap sandbox and print one JSON object describing what it saw."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from hpc.config.sandbox import SandboxConfig
from rollout_node.sandbox import open_sandbox

INT_QUIT = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGQUIT - 1))


def sig_ign(status_text: str) -> int:
    """The SigIgn mask from a /proc/PID/status text."""
    line = next(ln for ln in status_text.splitlines() if ln.startswith("SigIgn:"))
    return int(line.split()[1], 16)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    with open_sandbox(SandboxConfig(runtime="bwrap"), Path(sys.argv[1])) as sb:
        sb.run("export KEEP=kept")
        shell_pid = sb.shell.pid
        timed = sb.run("echo started; sleep 100", timeout_s=1.0)
        after = sb.run("echo $KEEP")
        child = sb.run("cat /proc/self/status")
        fresh = sb.exec(["cat", "/proc/self/status"])
        print(json.dumps({
            "node_ign": sig_ign(Path("/proc/self/status").read_text()) & INT_QUIT,
            "timed_out": timed.timed_out, "exit_code": timed.exit_code, "output": timed.output,
            "same_shell": sb.shell.pid == shell_pid, "after": after.output,
            "shell_child_ign": sig_ign(child.output) & INT_QUIT, "exec_ign": sig_ign(fresh.output) & INT_QUIT}))


if __name__ == "__main__":
    main()
