"""``spoolrl demo`` (the whole loop on one machine) and ``spoolrl report`` (plots + accounting)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hpc.cli_util import add_run_arg


def _demo(args: argparse.Namespace) -> int:
    from hpc.demo import run_demo

    return run_demo(out=Path(args.out) if args.out else None, resume=Path(args.resume) if args.resume else None,
                    steps=args.steps, overrides=list(args.overrides))


def _report(args: argparse.Namespace) -> int:
    from hpc.report import write_report

    out = write_report(Path(args.run), Path(args.output) if args.output else None)
    print(out)
    if args.tensorboard:
        from hpc.tensorboard import export_tensorboard

        print(export_tensorboard(Path(args.run), Path(args.tensorboard)))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo", help="run the whole loop on this machine (no Slurm needed)",
        description="Start the CPU inference engine, a rollout node with bwrap sandboxes and the DeepSpeed trainer "
        "as local processes on a tiny model and the built-in tasks; show progress; end with a summary.")
    p.add_argument("--out", metavar="RUN", help="run directory to create (default: ./runs/spoolrl-demo-XXXX)")
    p.add_argument("--steps", type=int, default=4, help="trainer steps (default 4)")
    p.add_argument("--resume", metavar="RUN", help="continue an interrupted demo run (as configured; --steps and "
                   "overrides apply only to new runs)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides on top of the demo's defaults")
    p.set_defaults(func=_demo)

    p = sub.add_parser("report", help="plots, an HTML page and report.json for a run",
                       description="Write PNG plots, one self-contained HTML page and report.json (every plotted "
                       "series plus accounting) into RUN/report/.")
    add_run_arg(p)
    p.add_argument("-o", "--output", metavar="FILE", help="HTML path (default RUN/report/report.html)")
    p.add_argument("--tensorboard", metavar="DIR", help="also write the metrics as TensorBoard event files into DIR "
                   "(needs the tensorboard package)")
    p.set_defaults(func=_report)
