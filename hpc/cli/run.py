"""``spoolrl config default``, ``spoolrl validate`` and ``spoolrl init``: configs and run directories.

Every launch path creates its run directory through :func:`hpc.rundir.create_run`, i.e. through
``spoolrl init``; validation (the config, then its paths from here: :func:`hpc.cli.util.load_checked`)
happens before anything touches the disk.
"""

from __future__ import annotations

import argparse
from typing import Any

from hpc.cli.util import add_config_args, add_run_arg, load_checked
from hpc.config import RunConfig, load_config
from hpc.errors import UsageError
from hpc.paths import TINY_MODEL, RunPaths
from hpc.rundir import config_digest, create_run


def _config_default(args: argparse.Namespace) -> int:
    from hpc.config.render import commented_yaml, reference_markdown

    print(reference_markdown(RunConfig) if args.markdown else commented_yaml(RunConfig()), end="")
    return 0


def _validate(args: argparse.Namespace) -> int:
    load_checked(args, args.overrides)
    print(f"{args.config or '(defaults)'}: valid")
    return 0


def prepare_model(paths: RunPaths, config: RunConfig) -> None:
    """``model.path: tiny`` builds a tiny random model + tokenizer into RUN/model (tests and the demo)."""
    if config.model.path != TINY_MODEL or (paths.model / "config.json").exists():
        return
    # The face may import a role (hpc/ outside hpc.cli may not); the tiny model needs torch, so only here.
    from train_node.infer.tiny import build_tiny_model

    build_tiny_model(paths.model, seed=config.run.seed)


def init_run(run: str, config: RunConfig, *, if_missing: bool = False) -> RunPaths:
    """The one code path every launcher uses to create a run directory."""
    return create_run(run, config, if_missing=if_missing, prepare=prepare_model)


def _check_digest(config: RunConfig, expected: str) -> None:
    if config_digest(config) != expected:
        raise UsageError(f"the config ({config_digest(config)}) is not the one the job script was rendered "
                         f"from ({expected}): the script was edited; re-render it with 'spoolrl render'")


def _init(args: argparse.Namespace) -> int:
    if args.expect_digest:  # the job's own init: its paths were checked (or deferred) when it was rendered
        config = load_config(args.config, args.overrides)
        _check_digest(config, args.expect_digest)
    else:
        config = load_checked(args, args.overrides)
    paths = init_run(args.run, config, if_missing=args.if_missing)
    print(paths.root)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="print the commented default config",
                       description="Print a complete, commented run.yaml with every default.")
    csub = p.add_subparsers(dest="config_command", metavar="<what>", required=True)
    d = csub.add_parser("default", help="the commented default run.yaml")
    d.add_argument("--markdown", action="store_true", help="the configuration reference as a Markdown table")
    d.set_defaults(func=_config_default)

    p = sub.add_parser("validate", help="check a run config without creating anything",
                       description="Validate run.yaml plus overrides, and the paths it names as this host sees them "
                       "(model, tasks, images; --paths-on-cluster skips those and lists them). Exit 2 listing every "
                       "problem with its dotted key and fix; 0 and 'valid' otherwise.")
    add_config_args(p)
    p.set_defaults(func=_validate)

    p = sub.add_parser("init", help="create a run directory (starts nothing)",
                       description="Validate the config as 'spoolrl validate' does, then create RUN with its layout, frozen "
                       "run.yaml and provenance (the model's hash). Nothing is created for an invalid config.")
    add_run_arg(p)
    add_config_args(p)
    p.add_argument("--if-missing", action="store_true",
                   help="if RUN already exists, check that the config matches instead of failing")
    p.add_argument("--expect-digest", metavar="SHA", help="refuse a config whose digest differs (rendered jobs)")
    p.set_defaults(func=_init)
