"""``spoolrl demo`` (the whole loop on one machine) and ``spoolrl report`` (plots + accounting)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hpc.cli.util import add_run_arg, print_json

DEFAULT_STEPS = 40  # = hpc.cli.demo_run.DEFAULT_STEPS (imported only when the verb runs)


def _demo(args: argparse.Namespace) -> int:
    from hpc.cli.demo_run import run_demo

    return run_demo(out=Path(args.out) if args.out else None, resume=Path(args.resume) if args.resume else None,
                    steps=args.steps, overrides=list(args.overrides))


def _warm_start(args: argparse.Namespace) -> int:
    import time

    from hpc.cli.demo_model import measure, warm_model

    t0 = time.monotonic()
    model = warm_model(seed=args.seed, system_prompt=args.system_prompt)
    out: dict[str, Any] = {"dir": str(model), "build_s": round(time.monotonic() - t0, 1)}
    if args.measure:
        out.update(measure(model, episodes=args.measure, temperature=args.temperature, seed=args.seed,
                           system_prompt=args.system_prompt))
    print_json(out)
    return 0


def _report(args: argparse.Namespace) -> int:
    from hpc.report import write_report

    missing: list[str] = []
    out = write_report(Path(args.run), Path(args.output) if args.output else None, missing=missing)
    for line in missing:
        print(f"spoolrl report: {line}", file=sys.stderr)
    print(out)
    if args.tensorboard:
        from hpc.tensorboard import export_tensorboard

        print(export_tensorboard(Path(args.run), Path(args.tensorboard)))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo", help="run the whole loop on this machine (no Slurm needed)",
        description="Start the CPU inference engine, a rollout node with bwrap sandboxes and the DeepSpeed trainer "
        "as local processes; by default the tiny model, warm-started on the format only, trains on the built-in "
        "'builtin-pick' tasks (reward ~0.25 before RL); show the reward step by step; end with a summary.")
    p.add_argument("--out", metavar="RUN", help="run directory to create (default: ./runs/spoolrl-demo-XXXX)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"trainer steps (default {DEFAULT_STEPS})")
    p.add_argument("--resume", metavar="RUN", help="continue an interrupted demo run (as configured; --steps and "
                   "overrides apply only to new runs)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides on top of the demo's defaults")
    p.set_defaults(func=_demo)

    p = sub.add_parser(
        "warm-start", help="build (or reuse) the demo's warm-started tiny model and measure it before RL",
        description="Fit the tiny model of --seed for a short while on format-only builtin-pick episodes (made "
        "with the agent's own chat pieces and tool-call format; the value written is drawn independently of "
        "the statement). Cached under $SPOOLRL_CACHE/warm-models. Prints its directory and, with --measure N, "
        "the share of well-formed episodes and the reward before any RL step (about 1/4).")
    p.add_argument("--seed", type=int, default=0, help="the run.seed it is for (tiny model and transcripts)")
    p.add_argument("--measure", type=int, default=64, metavar="N", help="sampled episodes to measure (0 = none)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of the measurement")
    p.add_argument("--system-prompt", choices=("brief", "full"), default="brief",
                   help="the rollout.system_prompt the transcripts and the measurement use (default brief, the "
                   "demo's; a run must use the one its warm start was fitted with)")
    p.set_defaults(func=_warm_start)

    p = sub.add_parser("report", help="plots, an HTML page and report.json for a run",
                       description="Write PNG plots, one self-contained HTML page and report.json (every plotted "
                       "series, the run's summary and config, accounting) into RUN/report/. Without matplotlib "
                       "(pip install 'spoolrl[report]') the page and report.json are written without plots.")
    add_run_arg(p)
    p.add_argument("-o", "--output", metavar="FILE", help="HTML path (default RUN/report/report.html)")
    p.add_argument("--tensorboard", metavar="DIR", help="also write the metrics as TensorBoard event files into DIR "
                   "(needs the tensorboard package)")
    p.set_defaults(func=_report)
