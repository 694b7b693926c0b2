"""Verbs that face Slurm: ``render``, ``launch``, ``status``, ``cancel``, ``resume``, ``scale``; and
:func:`launch_run`, the same launch from Python.

Guarantees: ``render`` and ``launch --dry-run`` print the same bytes for the same arguments and
touch nothing; ``launch`` creates the run directory (the one ``init`` code path), submits, prints
the job id and the run path, and returns; nothing here waits for a job to finish.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import typing as tp
from pathlib import Path

from hpc.cli.util import add_config_args, add_run_arg, print_json, warn_unchecked_model
from hpc.errors import RunDirError, UsageError
from hpc.paths import RunPaths

if tp.TYPE_CHECKING:
    from hpc.config import RunConfig
    from hpc.launch import HetSlurmJob
    from hpc.render import RenderedJob


def split_run_arg(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """RUN may come as ``--run DIR`` or as the one positional without '=' among the overrides."""
    bare = [o for o in args.overrides if "=" not in o]
    overrides = [o for o in args.overrides if "=" in o]
    if len(bare) > 1 or (bare and args.run):
        raise UsageError(f"more than one run directory given: {', '.join(bare + ([args.run] if args.run else []))}")
    return (args.run or (bare[0] if bare else None)), overrides


def _resolve(args: argparse.Namespace) -> tuple[RunConfig, Path, str]:
    from hpc.config import load_config

    run, overrides = split_run_arg(args)
    config = load_config(args.config, overrides)
    warn_unchecked_model(config)
    run_dir = Path(run) if run else Path.cwd() / "runs" / config.run.name
    source = " ".join([args.config or "(built-in defaults)", *map(shlex.quote, overrides)])
    return config, run_dir.absolute(), source


def init_hint(args: argparse.Namespace, run_dir: Path) -> str:
    """The exact ``spoolrl init`` command line that freezes the config this command rendered."""
    _run, overrides = split_run_arg(args)
    config = ["--config", args.config] if args.config else []
    return shlex.join(["spoolrl", "init", *config, str(run_dir), *overrides])  # RUN next to the overrides (argparse)


def _render_jobs(config: RunConfig, run_dir: Path, source: str, service: bool = False) -> list[RenderedJob]:
    from hpc.render import render, render_service

    return [render_service(config, run_dir, source=source)] if service else render(config, run_dir, source=source)


def _render(args: argparse.Namespace) -> int:
    from hpc.render import joined_text

    config, run_dir, source = _resolve(args)
    jobs = _render_jobs(config, run_dir, source, args.service)
    if args.output is None:
        sys.stdout.write(joined_text(jobs))
    else:
        out = Path(args.output)
        for job in jobs:
            target = out if len(jobs) == 1 else out.with_name(f"{out.stem}-{job.name}{out.suffix}")
            target.write_text(job.text)
            print(target)
    logs = RunPaths(run_dir).logs
    if not logs.is_dir():
        logs.mkdir(parents=True)  # sbatch opens the job's --output before the script runs; Slurm makes no dirs
        print(f"note: created {logs}/ for the job's Slurm output (#SBATCH --output)", file=sys.stderr)
    if not (run_dir / "run.yaml").exists():
        print(f"note: {run_dir} holds no run yet; the job creates it from the config embedded in the script, "
              f"or create it now with: {init_hint(args, run_dir)}", file=sys.stderr)
    return 0


def _print_submitted(submitted: list[tp.Any], run_dir: Path) -> None:
    for record, _job in submitted:
        print(f"submitted job {record.job_id} ({record.name}: {', '.join(record.roles)})")
    print(f"run: {run_dir}")


def _launch(args: argparse.Namespace) -> int:
    from hpc.render import joined_text

    config, run_dir, source = _resolve(args)
    jobs = _render_jobs(config, run_dir, source, args.service)
    if args.dry_run:
        sys.stdout.write(joined_text(jobs))
        return 0
    from hpc.cli.run import init_run
    from hpc.launch import submit

    paths = init_run(str(run_dir), config)
    _print_submitted(submit(paths, jobs, kind="launch"), paths.root)
    return 0


def launch_run(config: RunConfig, run_dir: str | Path, *, source: str = "python") -> list[HetSlurmJob]:
    """From Python: create the run directory, submit its job(s), return submitit handles
    (``job.state``, ``job.done()``, ``job.cancel()``, ``job.group_states(n)``).

    It lives in the face because creating a run may build the tiny model (``init_run``)."""
    from hpc.cli.run import init_run
    from hpc.launch import submit
    from hpc.render import render

    jobs = render(config, run_dir, source=source)
    paths = init_run(str(run_dir), config)
    return [handle for _, handle in submit(paths, jobs, kind="launch")]


def _open(run: str) -> tuple[tp.Any, RunConfig]:
    from hpc.rundir import open_run

    return open_run(run)


def _resume(args: argparse.Namespace) -> int:
    from hpc.config import apply_overrides, config_from_dict, to_dict
    from hpc.launch import active_jobs, submit
    from hpc.render import render
    from hpc.rundir import check_resume

    paths, frozen = _open(args.run)
    active = active_jobs(paths)
    if active and not args.force:
        ids = ", ".join(f"{r.job_id} ({state})" for r, state in active)
        raise RunDirError(f"{paths.root} still has active jobs: {ids}; 'spoolrl cancel {paths.root}' first "
                          "(or --force to add another job)")
    config = config_from_dict(apply_overrides(to_dict(frozen), args.overrides)) if args.overrides else frozen
    changed = check_resume(frozen, config)
    jobs = render(config, paths.root, source=f"{paths.run_yaml} (resume) {' '.join(args.overrides)}".strip())
    if args.dry_run:
        from hpc.render import joined_text

        sys.stdout.write(joined_text(jobs))
        return 0
    if changed:
        print(f"resuming with changed (resumable) keys: {', '.join(changed)}")
    _print_submitted(submit(paths, jobs, kind="resume"), paths.root)
    return 0


def _scale(args: argparse.Namespace) -> int:
    from hpc.launch import submit
    from hpc.render import render_scale

    if args.rollout_nodes < 1:
        raise UsageError("--rollout-nodes must be at least 1")
    paths, config = _open(args.run)
    job = render_scale(config, paths.root, args.rollout_nodes, source=f"{paths.run_yaml} (scale)")
    if args.dry_run:
        sys.stdout.write(job.text)
        return 0
    _print_submitted(submit(paths, [job], kind="scale"), paths.root)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    from hpc.launch import cancel_all

    paths, _ = _open(args.run)
    ids = cancel_all(paths)
    print(f"cancelled: {', '.join(ids)}" if ids else "no active jobs")
    return 0


def _status(args: argparse.Namespace) -> int:
    from hpc.status import check_interval, format_status, run_status

    check_interval(args.interval_s)
    if not (Path(args.run) / "run.yaml").exists():
        raise RunDirError(f"{args.run} is not a spoolrl run directory (no run.yaml)")
    if not args.json and not args.once and sys.stdout.isatty():
        from hpc.status import watch

        try:
            watch(args.run, sys.stdout, interval_s=args.interval_s)
        except KeyboardInterrupt:
            pass
        return 0
    status = run_status(args.run)
    if args.json:
        print_json(status)
    else:
        print(format_status(status))
    return 0


SERVICE_HELP = ("only the rollout-only service job (slurm.rollout nodes): spoolrl rollout-server, whose URL and "
                "token file land in RUN/endpoints/rollout-server.json")


def register(sub: tp.Any) -> None:
    p = sub.add_parser("render", help="write the sbatch script(s) of a run",
                       description="Render the heterogeneous batch script (or one per role with "
                       "slurm.mode: separate) from run.yaml. Writes -o (else stdout) and creates RUN/logs/, where the "
                       "script's #SBATCH --output points (Slurm creates no directory).")
    add_config_args(p)
    p.add_argument("--run", metavar="RUN", help="run directory (default ./runs/<run.name>); may also be "
                   "given as a bare positional")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout "
                   "(separate mode: FILE-<role>)")
    p.add_argument("--service", action="store_true", help=SERVICE_HELP)
    p.set_defaults(func=_render)

    p = sub.add_parser("launch", help="create the run directory and submit its job(s)",
                       description="Create RUN (as 'spoolrl init' does), sbatch the rendered script(s), "
                       "print the job id(s) and the run path, and return.")
    add_config_args(p)
    p.add_argument("--run", metavar="RUN", help="run directory (default ./runs/<run.name>)")
    p.add_argument("--dry-run", action="store_true", help="print what would be submitted (= 'spoolrl render')")
    p.add_argument("--service", action="store_true", help=SERVICE_HELP)
    p.set_defaults(func=_launch)

    p = sub.add_parser("status", help="Slurm state, spool, trainer and endpoints of a run")
    add_run_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable (schema in hpc/status.py)")
    p.add_argument("--once", action="store_true", help="print once even on a terminal (default there: live view)")
    p.add_argument("--interval-s", type=float, default=2.0, help="refresh interval of the live view "
                   "(at least 0.5)")
    p.set_defaults(func=_status)

    p = sub.add_parser("cancel", help="cancel every active job of a run (the run directory stays)")
    add_run_arg(p)
    p.set_defaults(func=_cancel)

    p = sub.add_parser("resume", help="submit a new job on an existing run directory",
                       description="Continue RUN from its latest checkpoint and the spool as it is. "
                       "Overrides may change only resumable keys (sizing, time limits).")
    add_run_arg(p)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="resumable overrides, e.g. slurm.rollout.nodes=4")
    p.add_argument("--dry-run", action="store_true", help="print the script instead of submitting it")
    p.add_argument("--force", action="store_true", help="submit even if a job of this run is still active")
    p.set_defaults(func=_resume)

    p = sub.add_parser("scale", help="add a rollout-only job to a running run",
                       description="Submit a job of N rollout nodes on RUN. Cancelling it loses nothing: "
                       "its leased tasks go back to the queue.")
    add_run_arg(p)
    p.add_argument("--rollout-nodes", type=int, required=True, metavar="N")
    p.add_argument("--dry-run", action="store_true", help="print the script instead of submitting it")
    p.set_defaults(func=_scale)
