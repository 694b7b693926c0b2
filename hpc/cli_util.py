"""Small helpers shared by the CLI modules: registering owner modules' verbs, JSON output."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Iterable
from typing import Any


def register_modules(sub: Any, modules: Iterable[str]) -> None:
    """Call ``register(sub)`` of each module that exists (a package's CLI is split by owner)."""
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
                raise  # a real missing dependency inside the module, not a module not written yet
            continue
        module.register(sub)


def print_json(obj: Any, *, stream: Any = None) -> None:
    json.dump(obj, stream or sys.stdout, sort_keys=True, default=str)
    (stream or sys.stdout).write("\n")


def add_run_arg(parser: argparse.ArgumentParser) -> None:
    """The one way a command takes a run directory: the positional RUN."""
    parser.add_argument("run", metavar="RUN", help="the run directory (on the shared filesystem)")
