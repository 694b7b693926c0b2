"""``spoolrl rollout-node RUN [--node-id ID] [--max-episodes N] [--once]``: the entry point a Slurm
job step runs on each rollout node.

It reads ``RUN/run.yaml``, logs to stderr and ``RUN/logs/rollout-<node>.log``, writes metrics to
``RUN/metrics/rollout-<node>.jsonl`` and runs the INIT -> RUN -> EVAL pipeline. Exit conditions
(exit status 0 in each of these; a configuration or run-dir problem exits 2; a node that stopped
itself exits 3):

- ``--once``: nothing is in flight on this node and the spool holds no ready and no claimed task
  (a claim held by a dead node is waited for until its lease expires and the task is redone).
- ``--max-episodes N``: after claiming N samples (whole groups), once they are written.
- ``RUN/control/STOP`` appears, or SIGUSR1 (Slurm's ``--signal`` warning), SIGTERM or SIGINT
  arrives: the node drains (no new claims; in-flight groups have ``rollout.drain_timeout_s`` to
  finish, then go back to the spool with ``release_task``; after a SIGTERM, which Slurm sent their
  sandboxes first, they go back at once) and exits.
- ``rollout.max_consecutive_infra_faults`` infrastructure faults in a row: the node stops claiming,
  releases every task it holds and exits 3, the reason on stderr and in the summary (``failed``).
- Otherwise it keeps polling the spool for new tasks.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc.cli.util import add_run_arg
from hpc.errors import UsageError
from hpc.paths import node_scratch, private_dir
from hpc.rundir import open_run
from hpc.slurm_env import SlurmEnv

if TYPE_CHECKING:  # the roles load late: `spoolrl --help` stays light
    from hpc.config import RunConfig
    from hpc.paths import RunPaths
    from rollout_node.pipeline.node import RolloutNode
    from rollout_node.pipeline.policy import Policy

DRAIN_SIGNALS = ("SIGUSR1", "SIGTERM", "SIGINT")
EXIT_FAILING = 3  # the node stopped itself (rollout_node.pipeline.health)


def default_node_id() -> str:
    env = SlurmEnv.from_environ()
    host = env.node_name or socket.gethostname().split(".")[0]
    return f"{host}-{env.procid}" if env.in_step else host


def setup_logging(log_dir: Path, node_id: str) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter(f"%(asctime)s {node_id} %(threadName)s %(levelname)s %(message)s")
    root = logging.getLogger("spoolrl")
    root.setLevel(logging.INFO)
    for handler in (logging.StreamHandler(sys.stderr), logging.FileHandler(log_dir / f"rollout-{node_id}.log")):
        handler.setFormatter(fmt)
        root.addHandler(handler)


def make_policy(paths: RunPaths, config: RunConfig) -> Policy:
    """The scripted policy, an agent harness behind the gateway, or the LLM agent loop against the run's
    inference servers."""
    if config.rollout.policy == "scripted":
        from rollout_node.pipeline.scripted import ScriptedPolicy

        return ScriptedPolicy(config.rollout.scripted_plan)
    if config.rollout.policy == "harness":
        from rollout_node.pipeline.harness import build_harness_policy

        return build_harness_policy(paths, config)
    from rollout_node.pipeline.llm import LLMPolicy

    return LLMPolicy(paths, config)


def build_node(run: str, node_id: str, *, max_episodes: int | None, once: bool) -> RolloutNode:
    from hpc.spool import Spool
    from rollout_node.pipeline.bindings import RealTaskOps
    from rollout_node.pipeline.node import NodeOptions, RolloutNode
    from rollout_node.pipeline.sizing import default_workers

    paths, config = open_run(run)
    setup_logging(paths.logs, node_id)
    # Per user: several users' nodes (or a root demo and a CI user) may share one node's $TMPDIR.
    try:  # ours and private: a directory another user planted under a shared /tmp is refused
        scratch = private_dir(node_scratch(config.sandbox.scratch_dir) / f"spoolrl-rollout-{os.getuid()}")
    except PermissionError as exc:
        raise UsageError(f"rollout node scratch is unusable: {exc}; set sandbox.scratch_dir to a directory "
                         "of your own") from exc
    workers = default_workers(config.rollout, config.sandbox, scratch)
    options = NodeOptions(node_id=node_id, workers=workers, scratch=scratch, max_episodes=max_episodes, once=once)
    spool = Spool(paths.root, config.spool)
    return RolloutNode(paths, config, spool, RealTaskOps(paths, config), make_policy(paths, config), options)


def _rollout_node(args: argparse.Namespace) -> int:
    node = build_node(args.run, args.node_id or default_node_id(), max_episodes=args.max_episodes, once=args.once)
    for name in DRAIN_SIGNALS:
        signal.signal(getattr(signal, name), lambda signum, _frame: node.request_drain(signal.Signals(signum).name))
    summary = node.run()
    print(json.dumps({**summary, "failed": node.failed}, sort_keys=True, default=str))
    if node.failed:
        print(f"spoolrl rollout-node: stopped itself: {node.failed}", file=sys.stderr)
        return EXIT_FAILING
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "rollout-node", help="run a rollout node (INIT -> RUN -> EVAL) on a run directory",
        description="Claim tasks from RUN's spool, run agent episodes in sandboxes, score them with the tasks' "
        "tests and write trajectory groups back. Drains on SIGUSR1/SIGTERM/SIGINT or RUN/control/STOP; "
        "cancel one task with a file RUN/control/cancel/<task_id>.",
    )
    add_run_arg(p)
    p.add_argument("--node-id", default="", help="name in logs, metrics and leases (default: host[-procid])")
    p.add_argument("--max-episodes", type=int, default=None, metavar="N",
                   help="claim at most N samples (whole groups), then exit when they are written")
    p.add_argument("--once", action="store_true",
                   help="exit when the spool has no ready or claimed task and nothing is in flight here")
    p.set_defaults(func=_rollout_node)
