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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


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
    ck.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    ck.set_defaults(func=cmd_check)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def cmd_check(args: argparse.Namespace) -> int:
    from hpc.config import load_config
    from hpc.errors import UsageError
    from rollout_node.tasks.instance import load_tasks
    overrides = list(args.overrides)
    if args.runtime:
        overrides.append(f"sandbox.runtime={args.runtime}")
        if args.runtime == "local":
            overrides.append("sandbox.allow_local=true")
    cfg = load_config(args.config, overrides)
    tasks = load_tasks(args.source)
    if args.instance:
        tasks = [t for t in tasks if t.instance_id in set(args.instance)]
        if not tasks:
            raise UsageError(f"none of {args.instance} is in {args.source}")
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    with tempfile.TemporaryDirectory(prefix="spoolrl-tasks-check-") as tmp:
        cache = _repo_cache(args, cfg, Path(tmp), {t.repo for t in tasks})
        scratch = args.scratch or Path(cfg.sandbox.scratch_dir or tmp)
        timeout = args.timeout_s or cfg.rollout.eval_timeout_s

        def one(task: Any) -> dict[str, Any]:
            return check_task(task, cfg, cache, scratch, timeout)

        failures = 0
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for row in pool.map(one, tasks):
                failures += not row["ok"]
                print(_json(row), flush=True)
    print(f"tasks check: {len(tasks) - failures}/{len(tasks)} instances ok "
          f"(gold=1, empty=0) in {time.monotonic() - start:.1f} s", file=sys.stderr)
    return 1 if failures else 0


def _repo_cache(args: argparse.Namespace, cfg: Any, tmp: Path, repos: set[str]) -> Path:
    from hpc.errors import UsageError
    from rollout_node.tasks.builtin import ensure_builtin_repos
    from rollout_node.tasks.repos import find_mirror
    cache = args.repo_cache or (Path(cfg.tasks.repo_cache) if cfg.tasks.repo_cache else None)
    from hpc.config.tasks import builtin_task_file

    if builtin_task_file(args.source) is not None:
        cache = cache or tmp / "repos"
        ensure_builtin_repos(cache)
    if cache is None:
        raise UsageError("give --repo-cache DIR (a mirror directory made by scripts/prepare_repos.py) "
                         "or set tasks.repo_cache")
    for repo in sorted(repos):
        find_mirror(cache, repo)  # a missing mirror is a usage error up front, not N harness errors
    return cache


def check_task(task: Any, cfg: Any, cache: Path, scratch: Path, timeout_s: float) -> dict[str, Any]:
    """Gold and empty evaluation of one task, as the JSON row ``tasks check`` prints."""
    from rollout_node.tasks.harness import evaluate
    kw = {"sandbox_cfg": cfg.sandbox, "scratch_dir": scratch, "repo_cache": cache, "timeout_s": timeout_s,
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
