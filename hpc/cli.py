"""The ``spoolrl`` command line: ``spoolrl <verb> --config run.yaml [key=value ...]`` or ``<verb> RUN``.

This module only dispatches. Each owner module exposes ``register(subparsers)`` and keeps its
imports light (no torch at import time), so ``spoolrl --help`` stays fast on a login node.
Every :class:`~hpc.errors.SpoolrlError` becomes a one-line message and its exit status.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from hpc import __version__
from hpc.cli_util import register_modules
from hpc.errors import SpoolrlError

# Owner modules of the verbs, in the order their verbs appear in --help.
COMMAND_MODULES = (
    "hpc.cli_run",          # config default, validate, init
    "hpc.cli_spool",        # spool stats, spool inspect
    "hpc.cli_launch",       # render, launch, resume, cancel, scale, status
    "rollout_node.cli",     # rollout-node, sandbox exec/shell, tasks check
    "train_node.cli",       # train-node, checkpoints, infer-node, serve, tiny-model
    "hpc.cli_demo",         # demo, report
)


def add_config_args(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    """The one way a command takes a config: ``--config FILE`` plus dotted ``key=value`` overrides."""
    parser.add_argument("--config", metavar="FILE", required=required,
                        help="run.yaml (see 'spoolrl config default'); omitted = built-in defaults")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides, e.g. trainer.lr=1e-5 slurm.rollout.nodes=4")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spoolrl",
        description="Slurm-native RL for LLM agents: rollouts on CPU nodes in rootless sandboxes, "
        "DeepSpeed training on GPU nodes, meeting only in a run directory.",
        epilog="Start with 'spoolrl demo' (no Slurm needed), then 'spoolrl config default > run.yaml'.",
    )
    parser.add_argument("--version", action="version", version=f"spoolrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    register_modules(sub, COMMAND_MODULES)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SpoolrlError as exc:
        print(f"spoolrl {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"spoolrl {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `spoolrl spool inspect X | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0


if __name__ == "__main__":
    sys.exit(main())
