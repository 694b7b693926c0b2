#!/usr/bin/env python3
"""prepare_repos.py CACHE_DIR [--tasks TASKS.jsonl|builtin]... [--source owner/name=URL_OR_PATH]...

Fill a repo cache for compute nodes without internet: one bare mirror per repository that the
task files name (``CACHE_DIR/owner__name.git``), cloned from ``--source`` (a git URL or a local
path) or from ``--url-template`` (default https://github.com/{repo}.git); built-in repositories
are built from the package. Then checks that every base_commit is in its mirror. Prints one JSON
line per repository; exits 1 if a commit is missing. Run it on a login node, point
``tasks.repo_cache`` at CACHE_DIR (on the shared filesystem, or copy it to node-local disk).

Examples:
  python scripts/prepare_repos.py /scratch/repos --tasks builtin
  python scripts/prepare_repos.py /scratch/repos --tasks swe.jsonl --source django/django=/data/django.git
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpc.errors import SpoolrlError, UsageError  # noqa: E402
from rollout_node.tasks.instance import load_tasks  # noqa: E402
from rollout_node.tasks.mirrors import DEFAULT_URL, prepare_cache  # noqa: E402


def parse_sources(items: list[str]) -> dict[str, str]:
    sources = {}
    for item in items:
        repo, sep, where = item.partition("=")
        if not sep or "/" not in repo or not where:
            raise UsageError(f"--source {item!r}: write owner/name=URL_OR_PATH")
        sources[repo] = str(Path(where).absolute()) if Path(where).exists() else where
    return sources


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cache_dir", type=Path, help="the repo cache to fill (created if missing)")
    parser.add_argument("--tasks", action="append", default=[], help="TASKS.jsonl or 'builtin' (repeatable)")
    parser.add_argument("--source", action="append", default=[], help="owner/name=URL_OR_PATH (repeatable)")
    parser.add_argument("--url-template", default=DEFAULT_URL, help="where other repos come from (default %(default)s)")
    parser.add_argument("--update", action="store_true", help="fetch into existing mirrors")
    args = parser.parse_args(argv)
    try:
        tasks = [t for source in (args.tasks or ["builtin"]) for t in load_tasks(source)]
        rows = prepare_cache(args.cache_dir, tasks, parse_sources(args.source), args.url_template, update=args.update)
    except SpoolrlError as exc:
        print(f"prepare_repos: error: {exc}", file=sys.stderr)
        return exc.exit_code
    for row in rows:
        print(json.dumps(row, sort_keys=True))
    missing = sum(len(r["commits_missing"]) for r in rows)
    hint = " (fetch newer history with --update, or check the task's repo/source)" if missing else ""
    print(f"prepare_repos: {len(rows)} repositories in {args.cache_dir}; {missing} commit(s) missing{hint}",
          file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
