"""``spoolrl sandbox exec|shell``: one command, or an interactive shell, exactly as the agent sees it.

``exec -- ARGV...`` runs ARGV exactly as given (like ``apptainer exec`` / ``docker exec``: each
word is one argument, nothing is re-split or expanded); a single word is a bash command line
(``exec -- 'cd src && make'``). Either way it runs in the agent's persistent bash.

``exec`` prints one JSON object (output, exit_code, timed_out, truncated, duration_s,
total_bytes) and exits 0 whenever the sandbox worked (the command's status is in the JSON);
infrastructure faults exit non-zero with a one-line message.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from hpc.cli.util import print_json
from hpc.config import load_config
from hpc.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("sandbox", help="run a command or a shell in an episode sandbox",
                       description="Run one command (exec) or an interactive shell (shell) in a rootless "
                       "sandbox, through the same persistent-bash path the agent uses.")
    verbs = p.add_subparsers(dest="sandbox_verb", metavar="<exec|shell>")
    ex = verbs.add_parser("exec", help="run one command; print one JSON result",
                          description="Run one command in a fresh sandbox through the agent's persistent bash "
                          "and print one JSON object (output, exit_code, timed_out, truncated, duration_s, "
                          "total_bytes). Exit 0 whenever the sandbox worked; the command's own status is in "
                          "the JSON. -- ARGV... runs ARGV as given; one quoted word (-- 'cd src && make') is a bash line.")
    _common(ex)
    ex.add_argument("--timeout-s", type=float, default=None, help="timeout of the command (default: config)")
    ex.add_argument("command", nargs=argparse.REMAINDER, help="-- ARGV... (run exactly as given), or -- 'ONE COMMAND LINE' (run by bash)")
    ex.set_defaults(func=cmd_exec)
    sh = verbs.add_parser("shell", help="interactive shell as the agent sees it (Ctrl-D quits)")
    _common(sh)
    sh.add_argument("--timeout-s", type=float, default=None, help="timeout of each command")
    sh.set_defaults(func=cmd_shell)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="run.yaml whose sandbox section to use")
    p.add_argument("--runtime", choices=["bwrap", "apptainer", "local"], help="override sandbox.runtime")
    p.add_argument("--image", help="root filesystem dir / archive / .sif (default: the test image)")
    p.add_argument("--workdir", required=True, type=Path, help="host dir mounted read-write at /work")
    p.add_argument("--allow-local", action="store_true", help="accept runtime 'local' (NO isolation)")


def _config(args: argparse.Namespace) -> Any:
    overrides = []
    if args.runtime:
        overrides.append(f"sandbox.runtime={args.runtime}")
    if args.allow_local:
        overrides.append("sandbox.allow_local=true")
    return load_config(args.config, overrides).sandbox


def cmd_exec(args: argparse.Namespace) -> int:
    from rollout_node.sandbox import open_sandbox
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError("no command given: spoolrl sandbox exec --workdir DIR -- COMMAND")
    with open_sandbox(_config(args), args.workdir, image=args.image) as sb:
        result = sb.run(command_line(command), timeout_s=args.timeout_s)
    print_json(result.to_dict())
    return 0


def command_line(argv: list[str]) -> str:
    """The bash command line for ``exec -- ARGV``: one word as is, several words quoted one by one."""
    return argv[0] if len(argv) == 1 else shlex.join(argv)


def cmd_shell(args: argparse.Namespace) -> int:
    from rollout_node.sandbox import open_sandbox
    with open_sandbox(_config(args), args.workdir, image=args.image) as sb:
        print(f"[spoolrl sandbox: runtime {sb.runtime.name}, /work = {sb.workdir}; Ctrl-D quits]", file=sys.stderr)
        while True:
            try:
                line = input("agent$ ")
            except EOFError:
                print(file=sys.stderr)
                return 0
            if not line.strip():
                continue
            r = sb.run(line, timeout_s=args.timeout_s)
            sys.stdout.write(r.output)
            flags = " timed out" * r.timed_out + " truncated" * r.truncated
            print(f"[exit {r.exit_code}{flags}; {r.duration_s * 1000:.1f} ms; {r.total_bytes} bytes]", file=sys.stderr)
