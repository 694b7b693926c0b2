"""The ``spoolrl`` command line: ``spoolrl <verb> --config run.yaml [key=value ...]`` or ``<verb> RUN``.

This package is the CLI face, the one place that may import every role: the verbs, the demo's
orchestration (:mod:`hpc.cli.demo_run`, :mod:`hpc.cli.demo_model`) and their helpers
(:mod:`hpc.cli.util`). Nothing else in ``hpc/`` imports a role, and no role imports this package
(``tests/unit/test_layering.py``). ``python -m hpc.cli`` runs :mod:`hpc.cli.__main__`.

Guarantees:
- Every verb module in :data:`VERB_MODULES` is imported by name; a module that fails to import is
  an error, never a silently missing verb.
- The verb modules keep their imports light (no torch at import time), so ``spoolrl --help``
  stays fast on a login node; handlers import what they need.
- Every :class:`~hpc.errors.SpoolrlError` becomes a one-line message and its exit status.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from hpc import __version__
from hpc.cli import demo, harness, infer, launch, model, rollout, run, sandbox, service, spool, tasks, train
from hpc.errors import SpoolrlError

# The verb modules, in the order their verbs appear in --help; each has ``register(subparsers)``.
VERB_MODULES = (
    run,        # config default, validate, init
    spool,      # spool stats, spool inspect
    launch,     # render, launch, status, cancel, resume, scale
    rollout,    # rollout-node
    service,    # rollout-server
    sandbox,    # sandbox exec, sandbox shell
    harness,    # harness install, harness check
    tasks,      # tasks check
    train,      # train-node, checkpoints
    infer,      # serve, tiny-model, infer-node
    model,      # model from-gguf
    demo,       # demo, warm-start, report
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spoolrl",
        description="Slurm-native RL for LLM agents: rollouts on CPU nodes in rootless sandboxes, "
        "DeepSpeed training on GPU nodes, meeting only in a run directory.",
        epilog="Start with 'spoolrl demo' (no Slurm needed), then 'spoolrl config default > run.yaml'.",
    )
    parser.add_argument("--version", action="version", version=f"spoolrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for module in VERB_MODULES:
        module.register(sub)
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
