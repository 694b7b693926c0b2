"""``spoolrl spool stats RUN [--json]`` and ``spoolrl spool inspect SHARD|RUN [--latest N] [--decode] [--json]``.

Read-only: neither command claims, moves or repairs anything (``stats`` creates the spool's
empty directories if a run directory lacks them). ``inspect --json`` prints one JSON
object per trajectory (token IDs included, via ``Trajectory.to_json``); a corrupt shard is an
error with the reason, not a traceback. ``inspect RUN --latest N`` reads the run's N most recently
sealed shards (ready, claimed or committed). ``--decode`` prints each trajectory as the conversation
it was (:mod:`hpc.decode`), decoded with the run's tokenizer (or ``--tokenizer DIR``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hpc.cli.util import add_run_arg, print_json
from hpc.errors import CorruptShardError, UsageError
from hpc.rundir import require_run


def register(sub: Any) -> None:
    p = sub.add_parser("spool", help="inspect the spool (tasks and trajectory shards)",
                       description="Inspect the shared-filesystem spool of a run. Read-only.")
    verbs = p.add_subparsers(dest="spool_command", metavar="<spool command>")
    stats = verbs.add_parser("stats", help="counts of tasks, shards and trajectories by state",
                             description="Counts of tasks, shards and trajectories by state.")
    add_run_arg(stats)
    stats.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    stats.set_defaults(func=cmd_stats)
    inspect = verbs.add_parser(
        "inspect", help="the trajectories in a shard file or a run's latest shards",
        description="Verify shard files and list their trajectories; with --decode, print each as the "
        "conversation it was.", epilog=DECODE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    inspect.add_argument("shard", metavar="SHARD|RUN", help="a .shard file, or a run directory (with --latest)")
    inspect.add_argument("--latest", type=int, default=1, metavar="N",
                         help="for a RUN: its N most recently sealed shards (default 1)")
    inspect.add_argument("--json", action="store_true", help="one JSON object per trajectory, token IDs included")
    inspect.add_argument("--decode", action="store_true", help="print trajectories as conversations (see below)")
    inspect.add_argument("--tokenizer", metavar="DIR", help="model dir with tokenizer.json (default: the run's model)")
    inspect.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                         help="dim context text (auto: when stdout is a terminal)")
    inspect.set_defaults(func=cmd_inspect)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def cmd_stats(args: argparse.Namespace) -> int:
    from hpc.spool import Spool

    run = Path(args.run)
    if not (run / "spool").is_dir():
        require_run(run)  # no spool and no run: the one wording (a run without spool/ gets it created)
    stats = Spool(run).stats()
    if args.json:
        print_json(stats)
        return 0
    width = max(len(k) for k in stats)
    for key, value in stats.items():
        print(f"{key:<{width}}  {value}")
    return 0


DECODE_HELP = """\
--decode prints, per trajectory, a header line, then one "[role]" line per message followed by its
text: [system], [task] (the first user message), [assistant N] (the policy's turn N, tool call
included), [observation N] (what the tools returned), then the outcome (status, reward, stop reason,
tests passed, diff size). Text decoded from generated tokens (loss_mask 1, trained) is printed as is;
context text (loss_mask 0, not trained: prompts, observations, chat-template pieces) is dimmed on a
terminal and wrapped in [ctx]...[/ctx] otherwise (--color never, or output to a pipe or file).
The tokenizer is RUN's model.tokenizer_path or model.path (run.yaml), or --tokenizer DIR."""


def _shard_paths(target: Path, latest: int) -> list[Path]:
    if target.is_file():
        return [target]
    if target.is_dir() and (target / "spool").is_dir():
        from hpc.decode import run_shards

        if latest < 1:
            raise UsageError(f"--latest {latest}: give a count of at least 1")
        shards = run_shards(target)
        if not shards:
            raise UsageError(f"{target}: the run has no sealed shards yet (RUN/spool/shards/*/)")
        return shards[-latest:]
    if target.is_dir():
        require_run(target)  # a directory that is no run: the one wording
    raise UsageError(f"{target}: no such shard file or run directory (shards live in RUN/spool/shards/*/)")


def _decoder(args: argparse.Namespace, first: Path) -> Any:
    from hpc.decode import load_tokenizer, run_of, run_tokenizer_dir

    if args.tokenizer:
        return load_tokenizer(args.tokenizer)
    run = run_of(first)
    if run is None:
        raise UsageError(f"{first} is not inside a run directory; give the model directory with --tokenizer DIR")
    return load_tokenizer(run_tokenizer_dir(run))


def _print_decoded(tokenizer: Any, traj: Any, color: bool) -> None:
    from hpc.decode import conversation, outcome_line, render_text

    print(f"=== {traj.trajectory_id}  task={traj.task_id}  sample={traj.sample_index}  "
          f"tokens={traj.num_tokens}  trained={traj.num_generated}")
    print(render_text(conversation(tokenizer, traj.token_ids, traj.loss_mask), color=color))
    print(f"[outcome] {outcome_line(traj.meta())}\n")


def _read_shard(path: Path) -> tuple[Any, list[Any]]:
    """A shard's table and trajectories; a file that is not a valid shard is one error (exit 2) with the reason."""
    from hpc.shard import read_shard_file, table_trajectories

    try:
        table = read_shard_file(path)
        return table, list(table_trajectories(table, str(path)))  # rows are checked as they are read
    except CorruptShardError as exc:
        raise UsageError(f"{path} is not a valid spoolrl shard ({str(exc).removeprefix(f'{path}: ')})") from exc


def cmd_inspect(args: argparse.Namespace) -> int:
    from hpc.shard import writer_session

    paths = _shard_paths(Path(args.shard), args.latest)
    tokenizer = _decoder(args, paths[0]) if args.decode else None
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    for path in paths:
        table, trajs = _read_shard(path)
        if args.json:
            for traj in trajs:
                print(json.dumps(traj.to_json(), sort_keys=True, default=str))
            continue
        print(f"shard {path.name}: {table.num_rows} trajectories, writer {writer_session(table)}, checksum ok")
        for t in trajs:
            if tokenizer is not None:
                _print_decoded(tokenizer, t, color)
                continue
            reward = "-" if t.reward is None else f"{t.reward:g}"
            print(f"  {t.trajectory_id}  task={t.task_id}  group={t.group_id}  sample={t.sample_index}  "
                  f"status={t.status.value}  reward={reward}  tokens={t.num_tokens}  generated={t.num_generated}")
    return 0
