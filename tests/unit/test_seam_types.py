"""The run directory's seams stay typed: bare ``Any`` on the spool, lease, claim, task and checkpoint
seams (and on the objects the roles hand each other: config, paths, sandbox, policy, engine, shard) is
counted with ``ast`` and may not grow past :data:`LIMIT`.

What is counted (library code: ``hpc/``, ``rollout_node/``, ``train_node/``, without the built-in
tasks' repositories), where "bare ``Any``" is an annotation that is exactly ``Any`` or
``<module>.Any`` (``typing.Any``, ``tp.Any``; ``dict[str, Any]``, a JSON record's honest type, is not):

1. In the seam modules (:data:`SEAM_MODULES`: the spool package, the claim, the task record, the
   checkpoint): every bare ``Any`` parameter (``*args``/``**kwargs`` too), return and annotated
   name or attribute (dataclass fields included).
2. Everywhere else: every parameter and annotated name or attribute *named* for a seam object
   (:data:`SEAM_NAMES`, or ending in ``_`` + one of them, e.g. ``task_dict`` does not, ``parent_task``
   does) that is annotated bare ``Any``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.unit.test_layering import library_files

REPO = Path(__file__).resolve().parents[2]
SEAM_MODULES = ("hpc/spool/", "hpc/records.py", "rollout_node/pipeline/claim.py", "train_node/trainer/checkpoint.py")
SEAM_NAMES = ("spool", "lease", "claim", "task", "checkpoint", "ckpt", "shard", "config", "paths", "sandbox", "policy",
              "engine")
LIMIT = 10


def is_bare_any(node: ast.expr | None) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        text = node.value.strip()
        return text == "Any" or (text.endswith(".Any") and text[:-4].isidentifier())
    if isinstance(node, ast.Name):
        return node.id == "Any"
    return isinstance(node, ast.Attribute) and node.attr == "Any" and isinstance(node.value, ast.Name)


def seam_name(name: str) -> bool:
    return any(name == s or name.endswith("_" + s) for s in SEAM_NAMES)


def _target_name(target: ast.expr) -> str:
    if isinstance(target, ast.Name):
        return target.id
    return target.attr if isinstance(target, ast.Attribute) else ""


def bare_any(source: str, whole_module: bool) -> Iterator[tuple[int, str]]:
    """(line, what) of each counted bare ``Any`` in ``source`` (see the module docstring)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p is not None)]
            for p in params:
                if is_bare_any(p.annotation) and (whole_module or seam_name(p.arg)):
                    yield p.lineno, f"parameter {p.arg!r} of {node.name}()"
            if whole_module and is_bare_any(node.returns):
                yield node.lineno, f"return of {node.name}()"
        elif isinstance(node, ast.AnnAssign) and is_bare_any(node.annotation):
            name = _target_name(node.target)
            if whole_module or seam_name(name):
                yield node.lineno, f"annotated {name!r}"


def count(root: Path) -> list[str]:
    found = []
    for rel, path in library_files(root):
        whole = any(rel == m or (m.endswith("/") and rel.startswith(m)) for m in SEAM_MODULES)
        found += [f"{rel}:{line}: {what}" for line, what in bare_any(path.read_text(), whole)]
    return found


def test_seams_carry_at_most_ten_bare_any() -> None:
    found = count(REPO)
    assert len(found) <= LIMIT, f"{len(found)} bare Any on the seams (limit {LIMIT}): type them\n" + "\n".join(found)


def test_the_count_sees_each_form(tmp_path: Path) -> None:
    (tmp_path / "hpc" / "spool").mkdir(parents=True)
    (tmp_path / "rollout_node").mkdir()
    (tmp_path / "train_node").mkdir()
    (tmp_path / "hpc" / "spool" / "x.py").write_text(
        "from typing import Any\nimport typing\n"
        "def f(a: Any, *rest: Any, b: dict[str, Any]) -> typing.Any: ...\n"
        "class C:\n    field: Any\n    ok: list[Any]\n")
    (tmp_path / "rollout_node" / "y.py").write_text(
        "from typing import Any\nimport typing as tp\n"
        "def g(spool: Any, other: Any, parent_task: 'Any', task_dict: Any) -> Any: ...\n"
        "class D:\n    def __init__(self, lease: Any) -> None:\n        self.claim: Any = None\n"
        "def h(config: tp.Any, paths: 'tp.Any', sandbox: Any, policy: Any, hf_config: dict[str, tp.Any]) -> None: ...\n")
    found = count(tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == [
        "parameter 'a' of f()", "parameter 'rest' of f()", "return of f()", "annotated 'field'",
        "parameter 'spool' of g()", "parameter 'parent_task' of g()", "parameter 'config' of h()",
        "parameter 'paths' of h()", "parameter 'sandbox' of h()", "parameter 'policy' of h()",
        "parameter 'lease' of __init__()", "annotated 'claim'"], found
