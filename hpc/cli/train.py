"""Verbs ``spoolrl train-node RUN`` (the entry point a Slurm job step runs) and ``spoolrl checkpoints RUN``.

Imports stay light at module level (no torch) so ``spoolrl --help`` is fast on a login node.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hpc.cli.util import add_run_arg, print_json
from hpc.config import apply_overrides, config_from_dict, to_dict
from hpc.paths import RunPaths
from hpc.rundir import check_resume, open_run


def register(sub: Any) -> None:
    p = sub.add_parser(
        "train-node", help="run the trainer of a run (one process per GPU: srun, torchrun or alone)",
        description="Train from the run's spool: feed tasks, consume trajectory shards, DeepSpeed steps, publish "
        "policy/vNNNNNN every trainer.publish_every steps, checkpoint (then commit the spool) every "
        "trainer.checkpoint_every steps. Resumes from checkpoints/LATEST. Exit status: 0 finished, "
        "75 stopped by SIGUSR1/SIGTERM after a checkpoint (requeue), other = failure.",
    )
    add_run_arg(p)
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="overrides of resumable keys only (e.g. trainer.total_steps=200)")
    p.add_argument("--max-idle-s", type=float, default=None,
                   help="exit 0 after this many seconds without data (default: wait for data forever)")
    p.set_defaults(func=_train_node)
    c = sub.add_parser("checkpoints", help="list the checkpoints of a run's lineage",
                       description="Each checkpoint of the lineage (oldest first): step, policy version, whether "
                       "its engine state is still on disk, and the spool shard ids it covers.")
    add_run_arg(c)
    c.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    c.set_defaults(func=_checkpoints)


def _load(run: str, overrides: list[str]) -> tuple[Any, Any]:
    paths, cfg = open_run(run)
    if overrides:
        new = config_from_dict(apply_overrides(to_dict(cfg), overrides))
        check_resume(cfg, new)
        cfg = new
    return paths, cfg


def _train_node(args: argparse.Namespace) -> int:
    paths, cfg = _load(args.run, list(args.overrides))
    from rollout_node.tasks.instance import task_file
    from train_node.trainer.feeder import instance_ids_for
    from train_node.trainer.loop import Options, Trainer

    opts = Options(instance_ids=instance_ids_for(task_file(cfg.tasks.source)), max_idle_s=args.max_idle_s)
    trainer = Trainer(paths.root, cfg, opts)
    try:
        trainer.setup()
        return trainer.run()
    finally:  # the process owns the group: gloo and NCCL torn down here, not by an interpreter exit
        import torch.distributed as tdist

        if tdist.is_initialized():
            tdist.destroy_process_group()


def _checkpoints(args: argparse.Namespace) -> int:
    from hpc.cli.api import checkpoint_rows

    paths = RunPaths(args.run)
    rows = checkpoint_rows(paths)
    if args.json:
        print_json({"run": str(paths.root), "checkpoints": rows})
        return 0
    if not rows:
        print(f"{paths.root}: no checkpoints yet")
        return 0
    print(f"{'tag':<14}{'step':>7}{'policy':>8}  {'state':<6}{'shards':>7}  shard ids")
    for r in rows:
        ids = ", ".join(r["shards"][:3]) + (f", ... (+{len(r['shards']) - 3})" if len(r["shards"]) > 3 else "")
        print(f"{r['tag']:<14}{r['step']:>7}{r['policy_version']:>8}  {'yes' if r['has_state'] else 'no':<6}"
              f"{len(r['shards']):>7}  {ids}", file=sys.stdout)
    return 0
