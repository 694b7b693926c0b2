"""Small helpers shared by the CLI modules: registering owner modules' verbs, JSON output."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from collections.abc import Iterable, Iterator
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


def warn_unchecked_model(config: Any) -> None:
    """Refuse an unsupported chat template now (ConfigError, exit 2); warn when it cannot be checked here."""
    from hpc.chat_format import check_config_model

    warning = check_config_model(config.model.path, config.model.tokenizer_path)
    if warning:
        print(warning, file=sys.stderr)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """While a verb that answers in JSON on stdout works: whatever libraries print goes to stderr.

    (DeepSpeed, imported by transformers through accelerate, logs 'Setting accelerator to CPU' to
    the stdout it finds at import time; under this context that is stderr.)"""
    with contextlib.redirect_stdout(sys.stderr):
        yield
