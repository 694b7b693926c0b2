"""``spoolrl tasks check TASKS.jsonl|builtin``: evaluate the gold and the empty patch of every instance.

Prints one JSON object per line (sorted keys) with ``instance_id``, ``gold_reward``, ``empty_reward``,
their statuses, ``pass_to_pass_failing_at_base`` (PASS_TO_PASS tests that do not pass without a fix:
the task is wrong), ``fail_to_pass_passing_at_base``, ``gold_not_passing`` and timings. Exits 0 only
if every gold reward is 1 and every empty reward is 0 (harness errors count as failures); a summary
goes to stderr. Repositories come from ``--repo-cache`` (or ``tasks.repo_cache``); the built-in
repositories are materialised there (or in a temporary directory) first. Dotted ``key=value``
config overrides follow the task source, before or after the flags (``tasks check builtin --jobs 4 tasks.eval_python=X``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc.config import load_config
from hpc.config.tasks import builtin_task_file
from hpc.errors import UsageError

if TYPE_CHECKING:  # the roles load late: `spoolrl --help` stays light
    from hpc.config import RunConfig
    from rollout_node.tasks.instance import TaskInstance


def register(sub: Any) -> None:
    p = sub.add_parser("tasks", help="task sets: check gold and empty patches",
                       description="Work with SWE-bench-style task sets.")
    verbs = p.add_subparsers(dest="tasks_verb", metavar="<check>")
    ck = verbs.add_parser("check", help="evaluate gold and empty patch of every instance (one JSON line each)",
                          description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ck.add_argument("source", metavar="TASKS.jsonl|builtin", help="a SWE-bench JSONL file, or a built-in set "
                    "('builtin', 'builtin-pick')")
    ck.add_argument("--runtime", choices=["bwrap", "apptainer", "local"], help="override sandbox.runtime "
                    "('local' = NO isolation, implies sandbox.allow_local)")
    ck.add_argument("--jobs", type=int, default=2, help="evaluations in parallel (default 2)")
    ck.add_argument("--repo-cache", type=Path, help="mirror directory (default tasks.repo_cache; for builtin "
                    "a temporary one)")
    ck.add_argument("--scratch", type=Path, help="where eval trees go (default sandbox.scratch_dir, else $TMPDIR)")
    ck.add_argument("--timeout-s", type=float, help="time limit of one test run (default rollout.eval_timeout_s)")
    ck.add_argument("--instance", action="append", default=[], help="only these instance ids (repeatable)")
    ck.add_argument("--config", metavar="FILE", help="run.yaml whose sandbox/tasks sections to use")
    ck.add_argument("--slurm", action="store_true", help="run the check as a submitit job array on CPU nodes "
                    "(chunks of instances; a failed or preempted chunk is retried once)")
    ck.add_argument("--chunks", type=int, default=8, help="--slurm: number of chunks = array tasks (default 8)")
    ck.add_argument("--partition", help="--slurm: partition (default slurm.rollout.partition)")
    ck.add_argument("--time-min", type=int, help="--slurm: time limit of a chunk in minutes (default "
                    "slurm.time_limit_min)")
    ck.add_argument("--array-parallelism", type=int, default=64, help="--slurm: chunks running at once (default 64)")
    ck.add_argument("--slurm-dir", type=Path, help="--slurm: shared directory for the job logs and the built-in "
                    "repositories (default ./spoolrl-tasks-check)")
    ck.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    ck.set_defaults(func=cmd_check)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def cmd_check(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.runtime:
        overrides.append(f"sandbox.runtime={args.runtime}")
        if args.runtime == "local":
            overrides.append("sandbox.allow_local=true")
    cfg = load_config(args.config, overrides)
    tasks = select_tasks(args.source, args.instance)
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    timeout = args.timeout_s or cfg.rollout.eval_timeout_s
    start = time.monotonic()
    if args.slurm:
        from hpc.cli.tasks_slurm import SlurmCheckOptions, check_on_slurm

        options = SlurmCheckOptions(folder=(args.slurm_dir or Path.cwd() / "spoolrl-tasks-check").absolute(),
                                    chunks=args.chunks, partition=args.partition, time_min=args.time_min,
                                    array_parallelism=args.array_parallelism)
        result = check_on_slurm(args.source, options, config=cfg, instances=args.instance,
                                repo_cache=args.repo_cache, scratch=args.scratch, timeout_s=timeout, jobs=args.jobs)
        rows = result.rows
        for row in rows:
            print(_json(row), flush=True)
    else:
        with tempfile.TemporaryDirectory(prefix="spoolrl-tasks-check-") as tmp:
            cache = repo_cache(args.source, cfg, args.repo_cache, Path(tmp), {t.repo for t in tasks})
            scratch = args.scratch or Path(cfg.sandbox.scratch_dir or tmp)
            rows = []
            for row in check_rows(tasks, cfg, cache, scratch, timeout, args.jobs):
                rows.append(row)
                print(_json(row), flush=True)
    failures = sum(not row["ok"] for row in rows)
    print(f"tasks check: {len(tasks) - failures}/{len(tasks)} instances ok "
          f"(gold=1, empty=0) in {time.monotonic() - start:.1f} s", file=sys.stderr)
    return 1 if failures else 0


def select_tasks(source: str, instances: list[str]) -> list[Any]:
    """The task set, or only ``instances`` of it (a UsageError if none of them is there)."""
    from rollout_node.tasks.instance import load_tasks

    tasks = load_tasks(source)
    if instances:
        tasks = [t for t in tasks if t.instance_id in set(instances)]
        if not tasks:
            raise UsageError(f"none of {instances} is in {source}")
    return tasks


def check_rows(tasks: list[Any], cfg: Any, cache: Path, scratch: Path, timeout_s: float,
               jobs: int) -> Iterator[dict[str, Any]]:
    """The rows of ``tasks``, in their order, ``jobs`` evaluations at a time (local; also each Slurm chunk)."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(lambda task: check_task(task, cfg, cache, scratch, timeout_s), tasks)


def repo_cache(source: str, cfg: Any, given: Path | None, tmp: Path, repos: set[str]) -> Path:
    """The mirror directory: ``given``, else tasks.repo_cache; built-in repositories are materialised
    there (or in ``tmp/repos``) first."""
    from rollout_node.tasks.builtin import ensure_builtin_repos
    from rollout_node.tasks.repos import find_mirror
    cache = given or (Path(cfg.tasks.repo_cache) if cfg.tasks.repo_cache else None)

    if builtin_task_file(source) is not None:
        cache = cache or tmp / "repos"
        ensure_builtin_repos(cache)
    if cache is None:
        raise UsageError("give --repo-cache DIR (a mirror directory made by scripts/prepare_repos.py) "
                         "or set tasks.repo_cache")
    for repo in sorted(repos):
        find_mirror(cache, repo)  # a missing mirror is a usage error up front, not N harness errors
    return cache


def check_task(task: TaskInstance, cfg: RunConfig, cache: Path, scratch: Path, timeout_s: float) -> dict[str, Any]:
    """Gold and empty evaluation of one task, as the JSON row ``tasks check`` prints."""
    from rollout_node.tasks.harness import evaluate
    kw: dict[str, Any] = {"sandbox_cfg": cfg.sandbox, "scratch_dir": scratch, "repo_cache": cache, "timeout_s": timeout_s,
          "eval_python": cfg.tasks.eval_python}
    gold = evaluate(task, task.patch, **kw)
    empty = evaluate(task, "", **kw)
    row = {
        "instance_id": task.instance_id,
        "gold_reward": gold.reward, "gold_status": gold.status,
        "empty_reward": empty.reward, "empty_status": empty.status,
        "gold_not_passing": sorted(t for t, v in gold.outcomes.items() if v != "PASSED"),
        "pass_to_pass_failing_at_base": [t for t in task.PASS_TO_PASS if empty.outcomes.get(t) != "PASSED"],
        "fail_to_pass_passing_at_base": [t for t in task.FAIL_TO_PASS if empty.outcomes.get(t) == "PASSED"],
        "gold_s": round(gold.duration_s, 3), "empty_s": round(empty.duration_s, 3),
    }
    errors = [r.error for r in (gold, empty) if r.error]
    if errors:
        row["errors"] = errors
    row["ok"] = gold.reward == 1.0 and empty.reward == 0.0 and not errors and gold.status == empty.status == "ok"
    return row


def _json(row: dict[str, Any]) -> str:
    import json
    return json.dumps(row, sort_keys=True)
