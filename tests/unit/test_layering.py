"""The import layering holds (README, "Layers"): every import, at module level or inside a function.

- ``hpc/`` is the shared core and knows no role: outside ``hpc/cli/`` it imports neither
  ``rollout_node`` nor ``train_node`` nor the CLI face ``hpc.cli``.
- ``rollout_node`` and ``train_node`` never import each other, and neither imports the face.
- Only ``hpc.cli`` (the face) may import every role.
- The roles reach the spool only through its package, ``hpc.spool`` (its faces ``RolloutSpool`` /
  ``ConsumerSpool``, ``Spool``, ``Shard``, ``TaskLease``): never a module inside it
  (``hpc.spool.lease``, ``hpc.spool.shards``, ...) nor the shard format and arrival order under it
  (``hpc.shard``, ``hpc.arrival``).

Imports are read with ``ast`` (``import``, ``from ... import`` with relative levels resolved, and
``importlib.import_module("...")`` / ``__import__("...")`` with a literal name), so an import hidden
in a function body counts as much as one at the top. There is no allow-list: a violation is fixed
by moving the code, not by listing it here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("hpc", "rollout_node", "train_node")
SKIP = ("rollout_node/tasks/builtin/repos/",)  # the built-in tasks' repositories: data, not spoolrl code
FACE = "hpc.cli"
ROLES = ("rollout_node", "train_node")
SPOOL = "hpc.spool"
SPOOL_INTERNALS = ("hpc.shard", "hpc.arrival")  # used by the spool; the roles see them through it


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute module of ``from <level dots><target> import ...`` written in ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def _literal_import(node: ast.Call) -> str | None:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def imported_names(source: str, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import anywhere in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            yield node.lineno, base
            for alias in node.names:  # `from hpc import cli` imports the module hpc.cli
                if alias.name != "*":
                    yield node.lineno, f"{base}.{alias.name}" if base else alias.name
        elif isinstance(node, ast.Call):
            name = _literal_import(node)
            if name:
                yield node.lineno, name


def forbidden_for(module: str) -> tuple[str, ...]:
    """The packages ``module`` must not import."""
    top = module.split(".")[0]
    if module == FACE or module.startswith(FACE + "."):
        return ()
    if top == "hpc":
        return ("rollout_node", "train_node", FACE)
    if top == "rollout_node":
        return ("train_node", FACE)
    if top == "train_node":
        return ("rollout_node", FACE)
    return ()


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def spool_internal(root: Path, name: str) -> bool:
    """Is ``name`` a module inside the spool package (not a name its ``__init__`` exports)?"""
    if any(_within(name, m) for m in SPOOL_INTERNALS):
        return True
    if not name.startswith(SPOOL + "."):
        return False
    first = name[len(SPOOL) + 1:].split(".")[0]
    package = root / SPOOL.replace(".", "/")
    return (package / f"{first}.py").is_file() or (package / first / "__init__.py").is_file()


def _spool_violations(root: Path, rel: str, module: str, source: str, is_package: bool) -> list[str]:
    if module.split(".")[0] not in ROLES:
        return []
    hits: dict[int, str] = {}  # one line per import statement
    for line, name in imported_names(source, module, is_package):
        if spool_internal(root, name):
            hits.setdefault(line, name)
    return [f"{rel}:{line}: {module} imports {name} (a role uses the spool through {SPOOL} only)"
            for line, name in hits.items()]


def library_files(root: Path) -> Iterator[tuple[str, Path]]:
    """Every library source file under ``root`` (the three packages, without the built-in tasks' repos): its
    path relative to ``root`` and its path."""
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if not any(rel.startswith(s) for s in SKIP):
                yield rel, path


def violations(root: Path) -> list[str]:
    found = []
    for rel, path in library_files(root):
        module = module_name(root, path)
        banned = forbidden_for(module)
        source, is_package = path.read_text(), path.name == "__init__.py"
        found += _spool_violations(root, rel, module, source, is_package)
        reported: set[int] = set()  # one line per import statement (`from X import a, b` names X and X.a)
        for line, name in imported_names(source, module, is_package):
            hit = next((b for b in banned if _within(name, b)), None)
            if hit and line not in reported:
                reported.add(line)
                found.append(f"{rel}:{line}: {module} imports {name} ({hit} is off limits for it)")
    return found


def test_no_import_crosses_a_layer() -> None:
    found = violations(REPO)
    assert not found, "import layering broken (see README, 'Layers'):\n" + "\n".join(found)


def _plant(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in PACKAGES:
        (root / package).mkdir(exist_ok=True)


@pytest.mark.parametrize("rel, text", [
    ("hpc/status.py", "def f():\n    from rollout_node.sandbox import open_sandbox\n"),
    ("hpc/demo.py", "import train_node.infer.tiny\n"),
    ("hpc/launch.py", "def f():\n    from hpc.cli.run import init_run\n"),
    ("hpc/spool/spool.py", "from hpc import cli\n"),
    ("hpc/config/base.py", "from .. import cli\n"),
    ("rollout_node/pipeline/node.py", "from hpc.cli.util import print_json\n"),
    ("rollout_node/agent/loop.py", "def f():\n    import train_node\n"),
    ("train_node/trainer/loop.py", "class A:\n    def f(self):\n        from rollout_node.agent import AgentLoop\n"),
    ("train_node/infer/node.py", "import importlib\nimportlib.import_module('hpc.cli')\n"),
    ("rollout_node/pipeline/sink.py", "from hpc.spool.lease import TaskLease\n"),
    ("train_node/trainer/consumer.py", "def f():\n    from hpc.spool import shards\n"),
    ("train_node/trainer/loop.py", "import hpc.shard\n"),
])
def test_a_planted_violation_is_found(tmp_path: Path, rel: str, text: str) -> None:
    _plant(tmp_path, {rel: text, "hpc/spool/__init__.py": "", "hpc/spool/lease.py": "", "hpc/spool/shards.py": ""})
    found = violations(tmp_path)
    assert len(found) == 1 and found[0].startswith(f"{rel}:"), found


def test_the_face_and_core_internals_are_allowed(tmp_path: Path) -> None:
    _plant(tmp_path, {
        "hpc/cli/demo_run.py": "from rollout_node.sandbox import open_sandbox\nimport train_node.infer.tiny\n",
        "hpc/cli/__init__.py": "from hpc.cli import run\n",
        "hpc/status.py": "from hpc.spool import Spool\nfrom . import paths\n",
        "rollout_node/tasks/harness.py": "from hpc.trajectory import Trajectory\nfrom .instance import TaskInstance\n",
        "train_node/trainer/feeder.py": "import importlib.util\nimportlib.util.find_spec('rollout_node')\n",
        "train_node/trainer/loop.py": "from hpc.spool import ConsumerSpool, Spool\nimport hpc.spool\n",
        "rollout_node/pipeline/claim.py": "from hpc.spool import TaskLease\n",
        "hpc/spool/spool.py": "from hpc.spool.lease import TaskQueue\nfrom hpc.shard import ShardWriter\n",
        "hpc/spool/lease.py": "",
    })
    assert violations(tmp_path) == []


def test_relative_imports_resolve() -> None:
    assert _resolve("hpc.config.base", False, 2, "cli") == "hpc.cli"
    assert _resolve("hpc.config", True, 1, "base") == "hpc.config.base"
    assert _resolve("rollout_node.pipeline.node", False, 1, None) == "rollout_node.pipeline"
