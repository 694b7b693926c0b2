"""``scripts/soak.py --minutes M [--seed S] [--out DIR]``: the demo loop under random SIGKILLs, then an audit.

What runs (every part real, as ``spoolrl demo`` starts it): the CPU inference engine under its
supervisor (``spoolrl infer-node``), a rollout node with bwrap sandboxes and EVAL, the DeepSpeed
trainer on CPU, and beside them ``spoolrl rollout-server`` on a run directory of its own, answering
``/process`` calls from a small client loop (one call at a time, against the same inference server).

For ``M`` minutes (the chaos window, counted from the trainer's first start) the soak plays Slurm and
the node supervisors: at moments drawn from ``--seed`` it SIGKILLs one role, often in a chosen phase
(mid-EVAL, mid-reload, mid-checkpoint, mid-publish, mid-call: :mod:`scripts.chaos.scheduler`), starts
it again on the same run directory (a requeue), and once stops and resumes the whole run as a new
allocation would (:mod:`scripts.chaos.harness`). Then the run drains (``RUN/control/STOP``) and the
audit (:mod:`scripts.chaos.audit`) prints one line per check and a JSON summary, also written to
``OUT/soak.json``: kills per role and phase, starts per role, each check's figures. Exit status 1
if any check failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.chaos.audit import Check, audit  # noqa: E402
from scripts.chaos.client import PROCESS_INSTANCE, ProcessClient  # noqa: E402
from scripts.chaos.harness import Harness, prepare, run_down  # noqa: E402
from scripts.chaos.procs import ROOT, now  # noqa: E402
from scripts.chaos.scheduler import run_chaos  # noqa: E402


def builtin_instance() -> dict[str, Any]:
    for line in (ROOT / "rollout_node/tasks/builtin/tasks.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["instance_id"] == PROCESS_INSTANCE:
            return {**row, "data_source": "swe_bench"}
    raise SystemExit(f"soak: {PROCESS_INSTANCE} is not among the built-in tasks")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--minutes", type=float, required=True, help="length of the chaos window (after the first trainer start)")
    p.add_argument("--seed", type=int, default=0, help="draws the kill moments, targets and phases")
    p.add_argument("--out", type=Path, default=None, help="a new directory for the runs and logs (default: ./runs/soak-<time>)")
    args = p.parse_args(argv)
    if args.minutes <= 0:
        p.error(f"--minutes must be > 0, not {args.minutes}")
    args.out = (args.out or Path.cwd() / "runs" / time.strftime("soak-%Y%m%d-%H%M%S")).resolve()
    return args


def soak(h: Harness, minutes: float) -> list[Check]:
    client = ProcessClient(h, builtin_instance())
    h.t0 = now()
    try:
        client.thread.start()
        run_chaos(h, client, minutes * 60.0)
        rundown = run_down(h, client)
    finally:
        h.kill_everything()
    return audit(h, client, rundown)


def report(h: Harness, args: argparse.Namespace, checks: list[Check]) -> None:
    summary = {"soak": "summary", "out": str(args.out), "seed": args.seed, "minutes": args.minutes,
               "elapsed_s": round(now() - h.t0, 1), "kills": h.kills_by_role(),
               "starts": {n: r.starts for n, r in h.roles.items()},
               "checks": {c.name: {"ok": c.ok, **c.detail} for c in checks}}
    for c in checks:
        print(f"soak check {c.name}: {'ok' if c.ok else 'FAILED'} {json.dumps(c.detail, default=str)}", flush=True)
    print(json.dumps(summary, default=str), flush=True)
    (args.out / "soak.json").write_text(json.dumps(summary, default=str, indent=1))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    h = prepare(args.out, args.seed)
    checks = soak(h, args.minutes)
    report(h, args, checks)
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
