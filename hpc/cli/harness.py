"""``spoolrl harness install SPEC --prefix DIR`` and ``spoolrl harness check DIR``: an agent harness for
``rollout.policy: harness`` (:mod:`rollout_node.pipeline.harness_install`, :mod:`rollout_node.pipeline.harness_check`).

``install`` prints the install's manifest as JSON; ``check`` prints one line per check and exits 1
when one failed. Both use the sandbox section of ``--config`` (default: bwrap on the test image).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hpc.config import load_config


def register(sub: Any) -> None:
    p = sub.add_parser("harness", help="install and check an agent harness for rollout.policy: harness",
                       description="Make a self-contained install of an agent harness that runs inside the "
                       "episode sandboxes (install), and try it once against a scripted backend (check).")
    verbs = p.add_subparsers(dest="harness_verb", metavar="<install|check>")
    ins = verbs.add_parser("install", help="build a harness install with the sandbox image's python",
                           description="pip collects SPEC and its dependencies as wheels on this host, then "
                           "the image's python installs them into a venv at DIR, inside a sandbox. With npm:PACKAGE, "
                           "npm installs it on this host into DIR/npm and its commands go to DIR/bin (the static "
                           "native build the package vendors, if any).")
    ins.add_argument("spec", metavar="SPEC", help="anything pip accepts: mini-swe-agent==2.4.6, a local directory...; "
                     "or npm:PACKAGE (npm on this host, e.g. npm:@openai/codex@VERSION)")
    ins.add_argument("--prefix", required=True, type=Path, metavar="DIR",
                     help="where the install goes (a new directory on the shared filesystem)")
    _common(ins)
    ins.set_defaults(func=cmd_install)
    chk = verbs.add_parser("check", help="run an install once in a sandbox against a scripted backend",
                           description="Checks the install, its console scripts on the sandbox's PATH, the "
                           "gateway through the loopback relay (and no network beyond), and with a command "
                           "one scripted episode.")
    chk.add_argument("prefix", metavar="DIR", type=Path, help="a directory made by 'spoolrl harness install'")
    chk.add_argument("--command", default=None,
                     help="the harness command line to try (default: rollout.harness.command of --config)")
    _common(chk)
    chk.set_defaults(func=cmd_check)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="run.yaml whose sandbox (and rollout.harness) sections to use")
    p.add_argument("--image", help="root filesystem dir / archive / .sif (default: the test image)")


def _config(args: argparse.Namespace) -> Any:
    return load_config(args.config, [])


def cmd_install(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from rollout_node.pipeline.harness_install import install

    manifest = install(args.spec, args.prefix, _config(args).sandbox, image=args.image)
    print(json.dumps({"prefix": str(args.prefix.absolute()), **asdict(manifest)}, indent=1))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from rollout_node.pipeline.harness_check import check_install

    config = _config(args)
    harness = config.rollout.harness
    command = harness.command if args.command is None else args.command
    checks = check_install(args.prefix.absolute(), config.sandbox, command, harness.env,
                           temperature=config.inference.temperature)
    for check in checks:
        print(check.line())
    if not command:
        print("(no --command and no rollout.harness.command: the episode check did not run)", file=sys.stderr)
    return 0 if all(c.ok for c in checks) else 1
