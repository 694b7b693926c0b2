"""``spoolrl spool stats RUN [--json]`` and ``spoolrl spool inspect SHARD [--json]``.

Read-only: neither command claims, moves or repairs anything (``stats`` creates the spool's
empty directories if a run directory lacks them). ``inspect --json`` prints one JSON
object per trajectory (token IDs included, via ``Trajectory.to_json``); a corrupt shard is an
error with the reason, not a traceback.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hpc.cli_util import add_run_arg, print_json
from hpc.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("spool", help="inspect the spool (tasks and trajectory shards)",
                       description="Inspect the shared-filesystem spool of a run. Read-only.")
    verbs = p.add_subparsers(dest="spool_command", metavar="<spool command>")
    stats = verbs.add_parser("stats", help="counts of tasks, shards and trajectories by state",
                             description="Counts of tasks, shards and trajectories by state.")
    add_run_arg(stats)
    stats.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    stats.set_defaults(func=cmd_stats)
    inspect = verbs.add_parser("inspect", help="the trajectories in one shard file",
                               description="Verify one shard file and list its trajectories.")
    inspect.add_argument("shard", metavar="SHARD", help="path of a .shard file")
    inspect.add_argument("--json", action="store_true", help="one JSON object per trajectory, token IDs included")
    inspect.set_defaults(func=cmd_inspect)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def cmd_stats(args: argparse.Namespace) -> int:
    run = Path(args.run)
    if not (run / "spool").is_dir():
        raise UsageError(f"{run} has no spool/ directory: give a run directory (made by 'spoolrl init')")
    from hpc.spool import Spool

    stats = Spool(run).stats()
    if args.json:
        print_json(stats)
        return 0
    width = max(len(k) for k in stats)
    for key, value in stats.items():
        print(f"{key:<{width}}  {value}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    path = Path(args.shard)
    if not path.is_file():
        raise UsageError(f"{path}: no such shard file (shards live in RUN/spool/shards/*/)")
    from hpc.shard import read_shard_file, table_trajectories, writer_session

    table = read_shard_file(path)
    trajs = table_trajectories(table, str(path))
    if args.json:
        for traj in trajs:
            print(json.dumps(traj.to_json(), sort_keys=True, default=str))
        return 0
    print(f"shard {path.name}: {table.num_rows} trajectories, writer {writer_session(table)}, checksum ok")
    for t in trajs:
        reward = "-" if t.reward is None else f"{t.reward:g}"
        print(f"  {t.trajectory_id}  task={t.task_id}  group={t.group_id}  sample={t.sample_index}  "
              f"status={t.status.value}  reward={reward}  tokens={t.num_tokens}  generated={t.num_generated}")
    return 0
