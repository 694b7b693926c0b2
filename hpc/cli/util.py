"""Helpers of the CLI face's verb modules: how a verb takes a config or a run directory, JSON output.

Only ``hpc.cli`` uses them: a role that needs one of these would be importing the face (the layering
test refuses it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any

from hpc.config import RunConfig, load_config
from hpc.config.checks import job_problems
from hpc.config.site import site_problems, unchecked_paths
from hpc.errors import ConfigError


def add_config_args(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    """The one way a command takes a config: ``--config FILE`` plus dotted ``key=value`` overrides (before or
    after the flags), and ``--paths-on-cluster`` for a config whose paths this host cannot see."""
    parser.add_argument("--config", metavar="FILE", required=required,
                        help="run.yaml (see 'spoolrl config default'); omitted = built-in defaults")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides, e.g. trainer.lr=1e-5 slurm.rollout.nodes=4")
    parser.add_argument("--paths-on-cluster", action="store_true",
                        help="the config's paths (model.path, tasks.source, images, ...) exist only on the cluster: "
                        "do not require them here (they are listed as unchecked)")


def load_checked(args: argparse.Namespace, overrides: list[str]) -> RunConfig:
    """``--config`` + overrides, validated as a run to submit (:func:`check_job`); with ``--paths-on-cluster``
    it prints which paths went unchecked."""
    config = check_job(load_config(args.config, overrides), paths_on_cluster=args.paths_on_cluster)
    if args.paths_on_cluster and (note := unchecked_paths(config)):
        print(f"spoolrl: note: {note}", file=sys.stderr)
    return config


def check_job(config: RunConfig, *, paths_on_cluster: bool = False) -> RunConfig:
    """``config`` as a run to submit (hpc.config.checks.job_problems) with its paths checked from here
    (hpc.config.site) and the harness install (``rollout.policy: harness``) unless ``paths_on_cluster``;
    ConfigError (exit 2) lists every problem."""
    problems = job_problems(config) + site_problems(config, paths_on_cluster=paths_on_cluster)
    if config.rollout.policy == "harness" and not paths_on_cluster:
        from rollout_node.pipeline.harness_install import check_prefix

        problems += check_prefix(config.rollout.harness.prefix)
    if problems:
        raise ConfigError(problems)
    return config


def print_json(obj: Any, *, stream: Any = None) -> None:
    json.dump(obj, stream or sys.stdout, sort_keys=True, default=str)
    (stream or sys.stdout).write("\n")


def add_run_arg(parser: argparse.ArgumentParser) -> None:
    """The one way a command takes a run directory: the positional RUN."""
    parser.add_argument("run", metavar="RUN", help="the run directory (on the shared filesystem)")


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """While a verb that answers in JSON on stdout works: whatever libraries print goes to stderr.

    (DeepSpeed, imported by transformers through accelerate, logs 'Setting accelerator to CPU' to
    the stdout it finds at import time; under this context that is stderr.)"""
    with contextlib.redirect_stdout(sys.stderr):
        yield
