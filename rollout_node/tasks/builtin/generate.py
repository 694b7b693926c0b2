"""Regenerate the built-in task files from their specs and the packaged repositories (deterministic).

``tasks.jsonl`` (``tasks.source: builtin``, the bug fixes) comes from ``spec.py``; ``pick.jsonl``
(``tasks.source: builtin-pick``, the learnable family) from ``pick.py``; the ``lookup*.jsonl`` sets and the
``lookup`` repository's ``settings/`` files (``builtin-lookup*``) from ``lookup.py``. Run
``python -m rollout_node.tasks.builtin.generate`` after editing a repository or a spec; add
``--check`` to only verify that the committed files are up to date (exit 1 if not).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

from rollout_node.tasks.builtin import HERE, OWNER, PICK_JSONL, REPOS_DIR, TASKS_JSONL
from rollout_node.tasks.builtin.lookup import SETS, lookup_specs, setting_files
from rollout_node.tasks.builtin.pick import pick_specs
from rollout_node.tasks.builtin.spec import SPECS, Edit, Spec
from rollout_node.tasks.repos import ensure_mirror, run_git


def apply_edits(root: Path, edits: tuple[Edit, ...]) -> None:
    for rel, old, new in edits:
        path = root / rel
        text = path.read_text() if path.exists() else ""
        if old:
            assert text.count(old) == 1, f"{rel}: edit anchor must occur exactly once: {old!r}"
            text = text.replace(old, new)
        else:
            text += new
        path.write_text(text)


def diff_of(root: Path, edits: tuple[Edit, ...]) -> str:
    """Apply edits to the checkout at ``root``, return the diff, and restore the checkout."""
    apply_edits(root, edits)
    run_git(["-C", root, "add", "-A"])
    out = run_git(["-C", root, "diff", "--cached", "--no-color", "--no-ext-diff"]).stdout.decode()
    run_git(["-C", root, "reset", "-q", "--hard"])
    return out


def existing_tests(root: Path, spec: Spec) -> list[str]:
    files = sorted({rel for rel, _, _ in spec.tests if (root / rel).exists()} | set(spec.p2p_files))
    return [f"{rel}::{name}" for rel in files for name in re.findall(r"^def (test_\w+)", (root / rel).read_text(), re.M)]


def instance(spec: Spec, root: Path, commit: str) -> dict[str, object]:
    repo = f"{OWNER}/{spec.repo}"
    return {
        "instance_id": f"{OWNER}__{spec.repo}-{spec.number}",
        "repo": repo,
        "base_commit": commit,
        "problem_statement": spec.problem_statement,
        "patch": diff_of(root, spec.fix),
        "test_patch": diff_of(root, spec.tests),
        "FAIL_TO_PASS": list(spec.fail_to_pass),
        "PASS_TO_PASS": existing_tests(root, spec),
        "image": "",
        "environment_setup_commit": commit,
        "version": "0.1",
        "test_cmd": "",
        "log_parser": "pytest",
    }


def render(specs: tuple[Spec, ...] = SPECS) -> str:
    lines = []
    with tempfile.TemporaryDirectory(prefix="spoolrl-gen-") as tmp:
        for name in sorted({s.repo for s in specs}):
            mirror, commit = ensure_mirror(Path(tmp) / "cache", f"{OWNER}/{name}", REPOS_DIR / name)
            root = Path(tmp) / name
            run_git(["clone", "-q", mirror, root])
            for spec in sorted((s for s in specs if s.repo == name), key=lambda s: s.number):
                lines.append(json.dumps(instance(spec, root, commit), sort_keys=False))
    return "\n".join(lines) + "\n"


def sync_setting_files(check: bool) -> bool:
    """Make ``repos/lookup/settings/`` hold exactly :func:`setting_files` (``check``: only compare); True if it did."""
    root = REPOS_DIR / "lookup"
    want = setting_files()
    have = {str(p.relative_to(root)): p.read_text() for p in sorted((root / "settings").glob("*"))}
    if have == want or check:
        return have == want
    for rel in set(have) - set(want):
        (root / rel).unlink()
    (root / "settings").mkdir(exist_ok=True)
    for rel, text in want.items():
        (root / rel).write_text(text)
    return True


def task_files() -> list[tuple[Path, tuple[Spec, ...]]]:
    """Every generated task file with its specs."""
    return [(TASKS_JSONL, SPECS), (PICK_JSONL, pick_specs()),
            *((HERE / file, lookup_specs(name)) for name, (file, _) in SETS.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only check that tasks.jsonl is up to date")
    args = parser.parse_args(argv)
    stale = 0
    if not sync_setting_files(args.check):
        print("repos/lookup/settings/ is stale: regenerate it", file=sys.stderr)
        stale += 1
    for path, specs in task_files():
        text = render(specs)
        if args.check:
            ok = path.exists() and path.read_text() == text
            print(f"{path.name} is {'up to date' if ok else 'stale: regenerate it'}", file=sys.stderr)
            stale += not ok
            continue
        path.write_text(text)
        print(f"wrote {len(text.splitlines())} instances to {path}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
