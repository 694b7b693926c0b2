"""EVAL: score an agent's final diff with the task's tests, tamper-proof.

What :func:`evaluate` does, in order (every step on a fresh directory under ``scratch_dir``):

1. Check out ``base_commit`` from the repo cache with a harness-owned git dir (outside the tree;
   the agent's ``.git`` never takes part) and check that the test patch applies to it; if not, the
   task is broken: ``harness_error``.
2. Apply the agent's diff (tracked and new files, binary too): ``git apply``, then once more with
   ``--recount --ignore-whitespace`` (hand-written diffs). A diff that does not apply scores 0
   with status ``ok`` (it is the agent's fault, not the infrastructure's).
3. Neutralise tampering: remove symlinks the agent added; delete agent-added test files and
   ``conftest.py``,
   pytest/tox/setup config files, ``*.pth``, ``sitecustomize``/``usercustomize``, bytecode,
   ``*.dist-info``/``*.egg-info`` metadata (pytest plugin entry points) and top-level modules that
   would shadow the standard library or the test runner; reset to the base version (or delete if
   new) every file the test patch touches, every file that holds a FAIL_TO_PASS/PASS_TO_PASS test,
   all base test infrastructure (under ``tests/``, ``test_*.py``, ``*_test.py``, ``conftest.py``)
   and runner configuration. Lines the diff adds to other files that name test-runner internals
   (``_pytest``, ``hookimpl``, ``TestReport``...) flag the result and force reward 0, unless the
   repository's own code already names them.
4. Apply the test patch; write a fresh per-run key into the tree (``KEYFILE``); run the tests in a
   FRESH sandbox whose ``/work`` is this tree. The default runner (:mod:`rollout_node.tasks.evalrunner`)
   is ``python3 -I -B`` with a cleared environment, plugin autoload off and ``-p no:cacheprovider``;
   it reads and unlinks the key before any code of the tree runs.
5. Outcomes come ONLY from the runner's result frame, authenticated with the key
   (:mod:`rollout_node.tasks.results`); the log is for humans. Reward 1 only if every FAIL_TO_PASS
   and PASS_TO_PASS test PASSED and nothing is flagged.

Statuses: ``ok`` (the reward is meaningful), ``timeout`` (the test run exceeded ``timeout_s``; reward
0), ``harness_error`` (an infrastructure fault: sandbox did not start, repo missing, broken task, the
runner never started; the pipeline must exclude it from the loss, never score it 0).

Threat model (the code under test is hostile; it runs inside the runner's process):

- Prevented: results imitated in the output (text, or frames with a guessed MAC: the key never
  leaves the runner's memory, the key file is gone before the tree runs); results written after the
  runner finished (it leaves with ``os._exit`` right after its frame, so no atexit hook of the tree
  runs, and the sandbox's pid namespace ends with it); a flood pushing the real results out of the
  bounded log (the frame is written last and the log is never parsed); the tree shadowing the runner
  or the modules it imports (all imported before the tree joins ``sys.path``); config and hooks read
  before collection (``conftest.py``, ``pytest.ini``/``pytest.toml``/``tox.ini``/``setup.cfg``/
  ``pyproject.toml`` anywhere, ``sitecustomize``/``usercustomize``, ``*.pth``, bytecode, dist-info
  entry points: new ones deleted, base ones reset); ``ctypes`` and ``/proc/*/mem`` (refused).
- Detected (reward 0, a ``tamper:`` flag): runner functions, classes, methods and descriptors
  replaced or added (checked at every report against a snapshot taken before the tree was
  importable); plugins whose code is the tree's; from the tree's non-test code: ``sys._getframe`` /
  ``inspect`` frames, traceback and generator frames, ``sys._current_frames``, trace and profile
  hooks, ``gc`` object walks, ``__code__`` writes, ``import _pytest``/``pluggy``; a missing, cut or
  forged frame (a ``results:`` flag); lines of the diff naming runner internals (the static scan).
- Not prevented: frames reached through a stdlib helper that returns one (``logging.currentframe``,
  ``traceback.walk_stack``) and walked with ``f_back`` (not audited by CPython); from there, changes to
  *instances* (the session, items, this run's recorder and its snapshot) rather than to runner
  classes; tree code that runs before pytest's configure (rootdir conftest imports) replacing runner
  objects with other objects defined in the runner's own packages; finalizers and threads of the tree
  running during the runner's last step; and making the tested functions right only while tests run
  (that is a fix as far as the tests can tell). Tasks with their own ``test_cmd`` are read from the
  log (unittest/Django style), with only the reset of step 3 and a truncated log forcing reward 0.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from hpc.config import SandboxConfig
from hpc.errors import SandboxError, SpoolrlError
from rollout_node.tasks.evalrunner import BOOT
from rollout_node.tasks.instance import TaskInstance
from rollout_node.tasks.parsers import outcomes_for
from rollout_node.tasks.patches import added_lines, patch_paths
from rollout_node.tasks.repos import find_mirror, harness_git_dir, run_git
from rollout_node.tasks.results import SOURCE, read_results

log = logging.getLogger(__name__)
KEYFILE = ".spoolrl-eval-key"  # the runner reads and unlinks it before any code of the tree runs
PROTECTED_NAMES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini",
                             "setup.cfg", "pyproject.toml", "sitecustomize.py", "usercustomize.py", KEYFILE})
RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "sitecustomize",
                            "usercustomize"})
SHADOW_SUFFIXES = (".py", ".pyc", ".so", ".pyd")
# Test-runner internals that a bug fix has no business touching: code that names them in a diff is
# trying to change how results are reported (unless the repository itself already does).
RUNNER_INTERNALS = re.compile(r"\b(_pytest|pluggy|TestReport|hookimpl|pytest_runtest_\w+|pytest_collection\w*|"
                              r"pytest_report\w*|pytest_terminal_summary|pytest_sessionfinish|_TextTestResult|"
                              r"TextTestResult|TestResult)\b")
EVAL_OUTPUT_KB = 4096
LOG_EXCERPT_CHARS = 8000
EVAL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ExecResult(Protocol):
    """What EVAL reads of ``Sandbox.exec``'s ToolResult."""

    @property
    def output(self) -> str: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def truncated(self) -> bool: ...


Opener = Callable[..., AbstractContextManager[Any]]


@dataclass(frozen=True)
class EvalResult:
    """The outcome of one evaluation; ``reward`` counts only when ``status`` is not ``harness_error``."""

    instance_id: str
    reward: float
    status: str  # 'ok' | 'timeout' | 'harness_error'
    outcomes: Mapping[str, str] = field(default_factory=dict)
    diff_applied: bool = False
    log: str = ""
    duration_s: float = 0.0
    error: str = ""
    flags: tuple[str, ...] = ()  # tampering suspected (reward forced to 0): "path: what"

    @property
    def infrastructure_failure(self) -> bool:
        return self.status == "harness_error"

    def to_dict(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "reward": self.reward, "status": self.status,
                "outcomes": dict(self.outcomes), "diff_applied": self.diff_applied, "log": self.log,
                "duration_s": round(self.duration_s, 3), "error": self.error, "flags": list(self.flags)}


@dataclass(frozen=True)
class _Tree:
    root: Path
    git: list[str]  # git args that address the harness-owned git dir and this tree


def evaluate(task: TaskInstance, diff: str, *, sandbox_cfg: SandboxConfig, scratch_dir: Path, repo_cache: Path,
             timeout_s: float = 600.0, eval_python: str = "python3", opener: Opener | None = None,
             keep: bool = False) -> EvalResult:
    """Score ``diff`` (the agent's final ``git diff``) on ``task``; never raises for agent behaviour."""
    start = time.monotonic()
    Path(scratch_dir).mkdir(parents=True, exist_ok=True)
    evaldir = Path(tempfile.mkdtemp(prefix=f"eval-{task.instance_id}-", dir=scratch_dir))
    try:
        result = _evaluate_in(task, diff, evaldir, sandbox_cfg, repo_cache, timeout_s, eval_python, opener)
    except (SpoolrlError, OSError) as exc:
        result = EvalResult(task.instance_id, 0.0, "harness_error", error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a fault of the runtime or of this harness: still one result, never a dead node
        log.exception("EVAL of %s failed unexpectedly", task.instance_id)
        result = EvalResult(task.instance_id, 0.0, "harness_error", error=f"unexpected {type(exc).__name__}: {exc}")
    finally:
        if not keep:
            shutil.rmtree(evaldir, ignore_errors=True)
    return replace(result, duration_s=time.monotonic() - start)


def _evaluate_in(task: TaskInstance, diff: str, evaldir: Path, sandbox_cfg: SandboxConfig, repo_cache: Path,
                 timeout_s: float, eval_python: str, opener: Opener | None) -> EvalResult:
    tree = _checkout(task, evaldir, repo_cache)
    if not _apply(tree, task.test_patch, check_only=True):
        raise SpoolrlError(f"{task.instance_id}: the test patch does not apply at base_commit; fix the task")
    missing = {t: "MISSING" for t in task.tests}
    if diff.strip() and not _apply(tree, diff):
        return EvalResult(task.instance_id, 0.0, "ok", missing, False, "the agent's diff does not apply")
    flags = _suspicious(tree, task, diff)
    _neutralise(tree, task)
    if not _apply(tree, task.test_patch):
        return EvalResult(task.instance_id, 0.0, "ok", missing, True,
                          "the test patch does not apply after the agent's changes")
    marker = f"spoolrl-eval-start-{secrets.token_hex(8)}"
    key = _write_key(tree.root)
    argv = build_test_argv(task, tree.root, eval_python, marker)
    run = _run_in_sandbox(task, tree.root, argv, sandbox_cfg, timeout_s, opener)
    if marker not in run.output:
        raise SandboxError(f"the test runner never started (no start marker; timed out: {run.timed_out}); "
                           f"check the image and tasks.eval_python. Output: {run.output[-600:]!r}")
    outcomes, more = _outcomes(task, run, key)
    flags.extend(more)
    passed = all(v == "PASSED" for v in outcomes.values())
    status = "timeout" if run.timed_out else "ok"
    reward = 1.0 if passed and status == "ok" and not flags else 0.0
    return EvalResult(task.instance_id, reward, status, outcomes, True, run.output[-LOG_EXCERPT_CHARS:],
                      flags=tuple(flags))


def _write_key(root: Path) -> bytes:
    """A fresh per-run key in ``root/KEYFILE`` (0600, never through a link the tree left)."""
    key = secrets.token_hex(32).encode()
    path = root / KEYFILE
    if path.is_symlink() or path.exists():
        _remove(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


def _outcomes(task: TaskInstance, run: ExecResult, key: bytes) -> tuple[dict[str, str], list[str]]:
    """Outcomes and flags: the runner's verified frame; for a custom ``test_cmd``, the log (see the docstring)."""
    if not task.test_cmd:
        results = read_results(run.output, key, task.tests)
        return results.outcomes, list(results.flags)
    flags = ["results: the log was truncated (results may be pushed out)"] if run.truncated else []
    return outcomes_for(task.tests, run.output, task.log_parser), flags


def _checkout(task: TaskInstance, evaldir: Path, repo_cache: Path) -> _Tree:
    mirror = find_mirror(repo_cache, task.repo)
    git_dir = harness_git_dir(evaldir, mirror, task.base_commit)
    root = evaldir / "tree"
    root.mkdir()
    tree = _Tree(root, ["--git-dir", str(git_dir), "--work-tree", str(root)])
    run_git([*tree.git, "reset", "-q", "--hard", task.base_commit], cwd=root)
    return tree


def _apply(tree: _Tree, patch: str, *, check_only: bool = False) -> bool:
    """Apply ``patch`` to the work tree (not the index); False if it does not apply."""
    data = patch.encode("utf-8", errors="surrogateescape")
    if not data.endswith(b"\n"):
        data += b"\n"
    extra = ["--check"] if check_only else []
    for flags in (["--whitespace=nowarn"], ["--whitespace=nowarn", "--recount", "--ignore-whitespace"]):
        if run_git([*tree.git, "apply", *flags, *extra, "-"], cwd=tree.root, input=data, check=False).returncode == 0:
            return True
    return False


def _neutralise(tree: _Tree, task: TaskInstance) -> None:
    """Undo every agent change that could influence how tests run or how results are reported."""
    root = tree.root
    base_files = set(_git_lines(tree, ["ls-files", "-z"]))
    base_links = {line.split("\t", 1)[1] for line in _git_lines(tree, ["ls-files", "-s", "-z"])
                  if line.startswith("120000 ")}
    for path in _walk_links(root):
        if path.relative_to(root).as_posix() not in base_links:
            path.unlink()
    for rel in _git_lines(tree, ["ls-files", "--others", "-z"]):
        if _forbidden_new_file(root, rel):
            (root / rel).unlink(missing_ok=True)
    reset = _reset_paths(task, base_files)
    for rel in sorted(reset):
        _remove(root / rel)
    restore = sorted(p for p in reset if p in base_files)
    if restore:
        run_git([*tree.git, "checkout", "-q", task.base_commit, "--", *restore], cwd=root)


def is_test_path(rel: str) -> bool:
    """Test infrastructure by location: under a ``tests`` directory, ``test_*.py``, ``*_test.py``, conftest."""
    path = Path(rel)
    name = path.name
    return ("tests" in path.parts[:-1] or name == "conftest.py"
            or (name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))))


def _reset_paths(task: TaskInstance, base_files: set[str]) -> set[str]:
    """Paths restored to base (or removed if new): the test patch's, the named tests' files, base test
    infrastructure (as SWE-bench splits fixes from tests, a fix never needs to change those) and
    runner configuration."""
    named = {t.split("::", 1)[0] for t in task.tests if "::" in t}
    base = {p for p in base_files if is_test_path(p) or Path(p).name in PROTECTED_NAMES}
    return set(patch_paths(task.test_patch)) | named | base


def _suspicious(tree: _Tree, task: TaskInstance, diff: str) -> list[str]:
    """Added lines naming test-runner internals, in files that are not reset anyway."""
    base_files = set(_git_lines(tree, ["ls-files", "-z"]))
    reset = _reset_paths(task, base_files)
    flags = []
    for rel, lines in added_lines(diff).items():
        if rel in reset:
            continue
        hits = sorted({m.group(1) for line in lines for m in RUNNER_INTERNALS.finditer(line)})
        hits = [h for h in hits if not _repo_uses(tree, task, h)]
        if hits:
            flags.append(f"{rel}: names test-runner internals ({', '.join(hits)})")
    return flags


def _repo_uses(tree: _Tree, task: TaskInstance, word: str) -> bool:
    """Whether the base commit's non-test code already names ``word`` (e.g. pytest's own repository)."""
    proc = run_git([*tree.git, "grep", "-q", "-w", "-F", word, task.base_commit, "--", "*.py", ":!*tests/*",
                    ":!*test_*.py", ":!*conftest.py"], cwd=tree.root, check=False)
    return proc.returncode == 0


def _git_lines(tree: _Tree, args: list[str]) -> list[str]:
    out = run_git([*tree.git, *args], cwd=tree.root).stdout.decode("utf-8", errors="surrogateescape")
    return [p for p in out.split("\0") if p]


def _walk_links(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):  # does not follow symlinked dirs
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                yield path


def _forbidden_new_file(root: Path, rel: str) -> bool:
    parts = Path(rel).parts
    name = parts[-1]
    if name in PROTECTED_NAMES or name.endswith((".pth", ".pyc", ".pyo")) or "__pycache__" in parts:
        return True
    if is_test_path(rel):  # new test infrastructure (e.g. a tests/__init__.py) is never needed by a fix
        return True
    if any(p.endswith((".dist-info", ".egg-info", ".egg-link")) for p in parts):
        return True
    return _shadows_module(root, Path(rel))


def _shadows_module(root: Path, rel: Path) -> bool:
    """A new top-level module (outside any package) named like a stdlib or test-runner module."""
    if rel.name == "__init__.py":
        module, parent = rel.parent.name, rel.parent.parent
    elif rel.suffix in SHADOW_SUFFIXES:
        module, parent = rel.name.split(".")[0], rel.parent
    else:
        return False
    if (root / parent / "__init__.py").exists():
        return False
    return module in RUNNER_MODULES or module in sys.stdlib_module_names


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def files_to_test(task: TaskInstance, root: Path) -> list[str]:
    """Files to hand to the test command: those named by the test ids, else those of the test patch."""
    named = {t.split("::", 1)[0] for t in task.tests if "::" in t}
    files = named or set(patch_paths(task.test_patch))
    return sorted(f for f in files if (root / f).is_file())


def build_test_argv(task: TaskInstance, root: Path, eval_python: str, marker: str) -> list[str]:
    """The command run inside the sandbox (cwd = the tree), with a cleared environment.

    ``marker`` is printed first, before any code of the tree can run.
    """
    env = ["env", "-i", f"PATH={EVAL_PATH}", "HOME=/tmp", "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1",
           "PYTHONHASHSEED=0"]
    files = files_to_test(task, root)
    if not task.test_cmd:
        return [*env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", eval_python, "-I", "-B", "-c", BOOT, SOURCE, marker, KEYFILE,
                *files]
    modules = [f[:-3].removeprefix("tests/").replace("/", ".") for f in files if f.endswith(".py")]
    cmd = task.test_cmd
    if "{test_files}" in cmd or "{test_modules}" in cmd:
        cmd = cmd.replace("{test_files}", shlex.join(files)).replace("{test_modules}", shlex.join(modules))
    else:
        cmd = f"{cmd} {shlex.join(files)}"
    return [*env, "bash", "-c", f"echo {marker} && {cmd}"]


def _run_in_sandbox(task: TaskInstance, root: Path, argv: list[str], sandbox_cfg: SandboxConfig,
                    timeout_s: float, opener: Opener | None) -> ExecResult:
    if opener is None:
        from rollout_node.sandbox import open_sandbox  # type: ignore[attr-defined,unused-ignore]
        opener = open_sandbox
    cfg = replace(sandbox_cfg, max_output_kb=max(sandbox_cfg.max_output_kb, EVAL_OUTPUT_KB))
    try:
        with opener(cfg, root, image=task.image or None) as sandbox:
            result: ExecResult = sandbox.exec(argv, timeout_s=timeout_s)
    except OSError as exc:
        raise SandboxError(f"the EVAL sandbox failed: {exc}") from exc
    return result
