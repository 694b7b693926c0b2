"""Verbs that face Slurm: ``render``, ``launch``, ``status``, ``cancel``, ``resume``, ``scale``.

Each verb is a thin face over :mod:`hpc.cli.api` (the Python API: ``Run``, ``Submission``): one code path.

Guarantees: ``render`` and ``launch --dry-run`` print the same bytes for the same arguments; ``launch
--dry-run`` touches nothing, ``render`` creates only ``RUN/logs/`` (the job's ``#SBATCH --output`` points
there, and Slurm creates no directory) and the ``-o`` file; ``launch`` checks the config, its paths and that ``sbatch`` is on PATH before it creates
the run directory (the one ``init`` code path), submits, prints the job id and the run path, and
returns; a RUN left by a launch whose submission failed (no job recorded, same config) is launched
again, not refused; nothing here waits for a job to finish.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import typing as tp
from pathlib import Path

from hpc.cli.util import add_config_args, add_run_arg, load_checked, print_json
from hpc.errors import SlurmError, UsageError
from hpc.paths import RunPaths

if tp.TYPE_CHECKING:
    from hpc.cli.api import Submission
    from hpc.config import RunConfig


def split_run_arg(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """RUN may come as ``--run DIR`` or as the one positional without '=' among the overrides."""
    bare = [o for o in args.overrides if "=" not in o]
    overrides = [o for o in args.overrides if "=" in o]
    if len(bare) > 1 or (bare and args.run):
        raise UsageError(f"more than one run directory given: {', '.join(bare + ([args.run] if args.run else []))}")
    return (args.run or (bare[0] if bare else None)), overrides


def _resolve(args: argparse.Namespace) -> tuple[RunConfig, Path, str]:
    from hpc.cli.api import config_source

    run, overrides = split_run_arg(args)
    config = load_checked(args, overrides)
    run_dir = Path(run) if run else Path.cwd() / "runs" / config.run.name
    return config, run_dir.absolute(), config_source(args.config, overrides)


def init_hint(args: argparse.Namespace, run_dir: Path) -> str:
    """The exact ``spoolrl init`` command line that freezes the config this command rendered."""
    _run, overrides = split_run_arg(args)
    config = ["--config", args.config] if args.config else []
    flags = ["--paths-on-cluster"] if args.paths_on_cluster else []
    return shlex.join(["spoolrl", "init", str(run_dir), *config, *flags, *overrides])


def _render(args: argparse.Namespace) -> int:
    from hpc.cli.api import render_jobs
    from hpc.render import joined_text

    config, run_dir, source = _resolve(args)
    jobs = render_jobs(config, run_dir, source, service=args.service)
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


def _print_submitted(submission: Submission) -> None:
    for record in submission.records:
        print(f"submitted job {record.job_id} ({record.name}: {', '.join(record.roles)})")
    print(f"run: {submission.root}")


def _launch(args: argparse.Namespace) -> int:
    from hpc.cli.api import Run, render_jobs
    from hpc.render import joined_text

    config, run_dir, source = _resolve(args)
    if args.dry_run:
        sys.stdout.write(joined_text(render_jobs(config, run_dir, source, service=args.service)))
        return 0
    require_sbatch()
    run = Run.create(run_dir, config, source=source, paths_on_cluster=args.paths_on_cluster)
    _print_submitted(run.submit(service=args.service))
    return 0


def require_sbatch() -> None:
    """Submission needs ``sbatch`` on PATH: checked before anything is created."""
    import shutil

    if shutil.which("sbatch") is None:
        raise SlurmError("sbatch not found on PATH: run this on a Slurm login node (or scripts/local_slurm.sh up); "
                         "nothing was created. 'spoolrl render' writes the script without Slurm")


def _resume(args: argparse.Namespace) -> int:
    from hpc.cli.api import Run

    submission = Run.open(args.run).resume(args.overrides, force=args.force, dry_run=args.dry_run)
    if args.dry_run:
        sys.stdout.write(submission.text)
        return 0
    if submission.changed:
        print(f"resuming with changed (resumable) keys: {', '.join(submission.changed)}")
    _print_submitted(submission)
    return 0


def _scale(args: argparse.Namespace) -> int:
    from hpc.cli.api import Run

    submission = Run.open(args.run).scale(args.rollout_nodes, dry_run=args.dry_run)
    if args.dry_run:
        sys.stdout.write(submission.text)
        return 0
    _print_submitted(submission)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    from hpc.cli.api import Run

    ids = Run.open(args.run).cancel()
    print(f"cancelled: {', '.join(ids)}" if ids else "no active jobs")
    return 0


def _status(args: argparse.Namespace) -> int:
    from hpc.cli.api import Run
    from hpc.status import check_interval, format_status

    check_interval(args.interval_s)
    run = Run.open(args.run)
    if not args.json and not args.once and sys.stdout.isatty():
        from hpc.status import watch

        try:
            watch(run.root, sys.stdout, interval_s=args.interval_s)
        except KeyboardInterrupt:
            pass
        return 0
    status = run.status()
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

    p = sub.add_parser("status", help="Slurm state, spool, trainer and endpoints of a run",
                       description="Show a run: the Slurm state of each job and group, the spool's counts, "
                       "the trainer's progress and reward, the live endpoints. On a terminal it refreshes "
                       "until Ctrl-C; --once prints once, --json gives the same as one JSON object.")
    add_run_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable (schema in hpc/status.py)")
    p.add_argument("--once", action="store_true", help="print once even on a terminal (default there: live view)")
    p.add_argument("--interval-s", type=float, default=2.0, help="refresh interval of the live view "
                   "(at least 0.5)")
    p.set_defaults(func=_status)

    p = sub.add_parser("cancel", help="cancel every active job of a run (the run directory stays)",
                       description="scancel every job of RUN that Slurm still runs or queues and print their "
                       "ids. RUN, its checkpoints and its spool stay: 'spoolrl resume RUN' continues it.")
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
