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
- Every verb parses its positionals (``key=value`` overrides, RUN) before, between or after its flags
  (:class:`VerbParser`), and a usage error prints that verb's usage, not the top-level one.
- ``--help`` shows plain text: docstring markup (double backticks, ``:role:`x```) is removed.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from hpc import __version__
from hpc.cli import demo, harness, infer, launch, model, rollout, run, sandbox, service, spool, tasks, train
from hpc.errors import SpoolrlError

# The verb modules, in the order their verbs appear in --help; each has ``register(subparsers)``.
VERB_MODULES = (
    demo,       # demo, warm-start, report (first: where a newcomer starts)
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
)

_RST_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def plain_text(text: str) -> str:
    """Help text without docstring markup: ``x`` -> x, :class:`~a.b.C` -> a.b.C."""
    return _RST_ROLE.sub(r"\1", text).replace("``", "")


class VerbParser(argparse.ArgumentParser):
    """A verb's parser: positionals may come anywhere among the flags (argparse's intermixed parse),
    and anything left over is this verb's usage error (exit 2), not the top-level parser's."""

    _inner = False  # True while argparse's intermixed parse calls back into parse_known_args

    def parse_known_args(  # type: ignore[override]  # typeshed's overloads; the behaviour is the base's
            self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        if self._inner:
            return super().parse_known_args(args, namespace)
        self._inner = True
        try:
            if any(a.nargs in (argparse.PARSER, argparse.REMAINDER) for a in self._get_positional_actions()):
                namespace, extras = super().parse_known_args(args, namespace)
            else:
                namespace, extras = self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inner = False
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        if not hasattr(namespace, "verb"):  # the innermost verb returns first: 'spoolrl spool stats'
            namespace.verb = self.prog
        return namespace, extras

    def format_help(self) -> str:
        return plain_text(super().format_help())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spoolrl",
        description="Slurm-native RL for LLM agents: rollouts on CPU nodes in rootless sandboxes, "
        "DeepSpeed training on GPU nodes, meeting only in a run directory.",
        epilog="Start with 'spoolrl demo' (no Slurm needed), then 'spoolrl config default > run.yaml'.",
    )
    parser.add_argument("--version", action="version", version=f"spoolrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", parser_class=VerbParser)
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
        print(f"{args.verb}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{args.verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `spoolrl spool inspect X | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0
