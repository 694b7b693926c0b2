"""Task repositories: the local mirror cache, deterministic built-in repos, agent work dirs and diffs.

Guarantees:
- Compute nodes need no network: every repository comes from a cache directory holding one bare
  mirror per repository (``<cache>/<owner>__<name>.git``; ``<owner>/<name>.git`` and the same names
  without ``.git`` are accepted too). ``scripts/prepare_repos.py`` fills such a directory.
- Built-in repositories are plain files in the package; :func:`materialise` turns one into a git
  commit whose id depends only on the file contents (fixed author, dates, modes and message), so the
  ``base_commit`` of the built-in tasks is reproducible on every machine.
  :func:`ensure_builtin_repos` creates the mirrors atomically (build aside, then rename), so several
  nodes may call it on one shared directory at once.
- :func:`prepare_workdir` gives the agent a checkout of ``base_commit`` with a one-commit history:
  a depth-1 fetch of that commit alone into a fresh ``.git`` (no alternates, no ref but ``main``,
  no ``FETCH_HEAD``), so no other commit, tag, stash or object of the mirror (the fix, later
  commits, other tasks) is reachable from the sandbox (tests/tasks/test_no_peeking.py).
- :func:`collect_diff` never trusts the work dir's ``.git`` (the agent controls it: hooks, filter
  drivers and fsmonitor commands there could run on the host). It diffs the work tree against
  ``base_commit`` with a fresh, harness-owned git directory whose objects come from the mirror.
  When git cannot diff the tree, :func:`collect_diff` tells the agent's doing from the node's: it
  raises :class:`UnscorableTree` (the agent's outcome: reward 0, no retry) when the tree holds
  entries the agent made undiffable (:func:`tree_problems`: FIFOs, sockets, devices, entries
  without owner read/search permission, nested repositories) or when the same harness diffs a
  pristine checkout of ``base_commit`` fine (so the tree's state is the cause); otherwise
  (mirror, disk, git broken for a pristine tree too) the SpoolrlError stands: infrastructure.
- Every git call runs with system and global config disabled and hooks off.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from hpc.errors import SpoolrlError, UsageError
from rollout_node.tasks.instance import TaskInstance

FIXED_NAME = "spoolrl tasks"
FIXED_EMAIL = "tasks@spoolrl.invalid"
FIXED_DATE = "2025-01-01T00:00:00+00:00"
BASE_MESSAGE = "Import {name}\n"
# Noise that never belongs in an agent's diff: bytecode, caches, editor and packaging droppings.
JUNK_PATTERNS = ("__pycache__/", "*.pyc", "*.pyo", ".pytest_cache/", ".mypy_cache/", ".ruff_cache/",
                 "*.egg-info/", ".coverage", ".eggs/", "*.orig", "*.rej", ".spoolrl/")


MAX_PROBLEMS = 8


class UnscorableTree(SpoolrlError):
    """The work tree's own state (the agent's doing) keeps git from diffing it: reward 0, no retry."""


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which only the repository's own (harness-owned) config counts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
                "LC_ALL": "C", "GIT_AUTHOR_NAME": FIXED_NAME, "GIT_AUTHOR_EMAIL": FIXED_EMAIL,
                "GIT_COMMITTER_NAME": FIXED_NAME, "GIT_COMMITTER_EMAIL": FIXED_EMAIL})
    env.update(extra or {})
    return env


def run_git(args: Sequence[str | os.PathLike[str]], *, cwd: Path | None = None, input: bytes | None = None,
            env: dict[str, str] | None = None, check: bool = True,
            deadline: float | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run git with hooks and fsmonitor off; raise SpoolrlError with git's message when ``check``.

    ``deadline`` (``time.monotonic()``): past it git and every process it started are killed and
    SpoolrlError says so - a checkout stalled on a shared filesystem must not hold an INIT worker.
    """
    argv = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "core.autocrlf=false",
            *map(str, args)]
    if deadline is None:
        proc = subprocess.run(argv, cwd=cwd, input=input, capture_output=True, env=git_env(env), check=False)
    else:
        proc = _run_until(argv, deadline, cwd=cwd, input=input, env=git_env(env))
    if check and proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip()
        raise SpoolrlError(f"git {' '.join(map(str, args[:3]))} failed (exit {proc.returncode}): {msg}")
    return proc


def _run_until(argv: list[str], deadline: float, *, cwd: Path | None, input: bytes | None,
               env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """subprocess.run with a deadline that kills the whole process group (git fetch starts upload-pack)."""
    what, left = "git " + " ".join(argv[7:10]), deadline - time.monotonic()
    if left <= 0:
        raise SpoolrlError(f"no time left to run {what} (the stage's time limit has passed)")
    with subprocess.Popen(argv, cwd=cwd, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(input, timeout=left)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise SpoolrlError(f"{what} was still running at the stage's time limit "
                               f"({left:.1f} s left when it started) and was killed: a stalled filesystem?") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def git_out(args: Sequence[str | os.PathLike[str]], **kwargs: object) -> str:
    return run_git(args, **kwargs).stdout.decode().strip()  # type: ignore[arg-type]


def mirror_name(repo: str) -> str:
    """``owner/name`` -> the cache entry name ``owner__name.git``."""
    return repo.replace("/", "__") + ".git"


def find_mirror(cache_dir: Path, repo: str) -> Path:
    """The mirror of ``repo`` in ``cache_dir``; UsageError saying how to prepare it when absent."""
    owner, _, name = repo.partition("/")
    for candidate in (mirror_name(repo), mirror_name(repo)[:-4], f"{owner}/{name}.git", f"{owner}/{name}"):
        path = Path(cache_dir) / candidate
        if (path / "HEAD").is_file() or (path / ".git").exists():
            return path
    raise UsageError(f"repository {repo!r} is not in the repo cache {cache_dir} (looked for "
                     f"{mirror_name(repo)}); prepare it with: python scripts/prepare_repos.py {cache_dir} "
                     f"--tasks TASKS.jsonl (or tasks.repo_cache=DIR)")


def has_commit(git_dir: Path, commit: str) -> bool:
    return run_git(["--git-dir", git_dir, "cat-file", "-e", f"{commit}^{{commit}}"], check=False).returncode == 0


JUNK_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".git"})


def source_files(src: Path) -> list[Path]:
    """Files of a packaged repository, sorted, without caches a local test run may have left."""
    files = [p for p in src.rglob("*") if p.is_file() and not JUNK_DIRS.intersection(p.relative_to(src).parts)
             and p.suffix not in (".pyc", ".pyo")]
    return sorted(files, key=lambda p: p.relative_to(src).as_posix())


def materialise(src: Path, git_dir: Path, name: str) -> str:
    """Commit the files under ``src`` into the bare repo ``git_dir`` (created) as ``main``; return the id.

    Plumbing only (hash-object, update-index, commit-tree) with fixed identity, dates, modes and
    message: the id depends on file contents alone, not on umask, clock or user config.
    """
    run_git(["init", "-q", "--bare", "--template=", git_dir])
    files = source_files(src)
    paths = "\n".join(str(p) for p in files).encode()
    shas = git_out(["--git-dir", git_dir, "hash-object", "-w", "--no-filters", "--stdin-paths"], input=paths).split()
    info = "".join(f"100644 {sha}\t{p.relative_to(src).as_posix()}\n" for sha, p in zip(shas, files, strict=True))
    index_env = {"GIT_INDEX_FILE": str(git_dir / "spoolrl-build-index")}
    run_git(["--git-dir", git_dir, "update-index", "--add", "--index-info"], input=info.encode(), env=index_env)
    tree = git_out(["--git-dir", git_dir, "write-tree"], env=index_env)
    (git_dir / "spoolrl-build-index").unlink()
    dates = {"GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE}
    commit = git_out(["--git-dir", git_dir, "commit-tree", tree, "-m", BASE_MESSAGE.format(name=name).strip()],
                     env=dates)
    run_git(["--git-dir", git_dir, "update-ref", "refs/heads/main", commit])
    run_git(["--git-dir", git_dir, "symbolic-ref", "HEAD", "refs/heads/main"])
    run_git(["--git-dir", git_dir, "repack", "-a", "-d", "-q"])  # one pack: few files on a shared filesystem
    run_git(["--git-dir", git_dir, "prune-packed"])
    return commit


def ensure_mirror(cache_dir: Path, repo: str, src: Path) -> tuple[Path, str]:
    """The mirror of a packaged repository in ``cache_dir``, built if missing; (path, commit id)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / mirror_name(repo)
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{target.name}-", dir=cache_dir))
    try:
        commit = materialise(src, tmp / "repo.git", repo)
        if target.exists() and has_commit(target, commit):
            return target, commit
        try:
            os.rename(tmp / "repo.git", target)
        except OSError:  # another node won the race, or a stale mirror is in the way
            if not has_commit(target, commit):
                raise UsageError(f"{target} exists but lacks commit {commit} of {repo}; remove it and retry") from None
        return target, commit
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare_workdir(task: TaskInstance, workdir: Path, repo_cache: Path, timeout_s: float | None = None) -> None:
    """Check out the task's ``base_commit`` into the empty or new ``workdir`` with a one-commit history.

    ``timeout_s``: past it the git process running then is killed and SpoolrlError raised.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    task_repo, base_commit = task.repo, task.base_commit
    mirror = find_mirror(repo_cache, task_repo)
    workdir.mkdir(parents=True, exist_ok=True)
    if any(workdir.iterdir()):
        raise UsageError(f"{workdir}: the work dir must be empty to prepare a task checkout")
    run_git(["init", "-q", "--template=", "-b", "main", workdir], deadline=deadline)
    fetched = run_git(["-C", workdir, "fetch", "-q", "--depth=1", "--no-tags", mirror.absolute(), base_commit],
                      check=False, deadline=deadline)
    if fetched.returncode != 0:
        raise UsageError(f"commit {base_commit} of {task_repo} is not in {mirror}; refresh the repo cache "
                         f"(scripts/prepare_repos.py): {fetched.stderr.decode(errors='replace').strip()}")
    run_git(["-C", workdir, "reset", "-q", "--hard", base_commit], deadline=deadline)
    (workdir / ".git" / "FETCH_HEAD").unlink(missing_ok=True)  # names the host path of the mirror
    run_git(["-C", workdir, "config", "user.name", "agent"], deadline=deadline)
    run_git(["-C", workdir, "config", "user.email", "agent@spoolrl.invalid"], deadline=deadline)
    (workdir / ".git" / "info").mkdir(exist_ok=True)
    (workdir / ".git" / "info" / "exclude").write_text("\n".join(JUNK_PATTERNS) + "\n")


def harness_git_dir(parent: Path, mirror: Path, base_commit: str) -> Path:
    """A fresh git dir under ``parent`` that borrows the mirror's objects and has HEAD at base_commit."""
    git_dir = Path(tempfile.mkdtemp(prefix="harness-", dir=parent)) / "repo.git"
    run_git(["init", "-q", "--bare", "--template=", git_dir])
    objects = (mirror / "objects") if (mirror / "objects").is_dir() else (mirror / ".git" / "objects")
    (git_dir / "objects" / "info" / "alternates").write_text(str(objects.absolute()) + "\n")
    if not has_commit(git_dir, base_commit):
        raise UsageError(f"commit {base_commit} is not in {mirror}; refresh the repo cache (scripts/prepare_repos.py)")
    run_git(["--git-dir", git_dir, "update-ref", "--no-deref", "HEAD", base_commit])
    (git_dir / "info").mkdir(exist_ok=True)
    (git_dir / "info" / "exclude").write_text("\n".join(JUNK_PATTERNS) + "\n")
    return git_dir


def collect_diff(workdir: Path, task: TaskInstance, repo_cache: Path) -> str:
    """The agent's changes to ``workdir`` against ``base_commit`` as a binary-safe git diff.

    Includes modified, deleted and new untracked files (committed or not); excludes junk
    (:data:`JUNK_PATTERNS`) and the work dir's own ``.git``. Reads nothing from that ``.git``.
    Raises :class:`UnscorableTree` when the tree's state is why it cannot be diffed (see the module
    docstring), SpoolrlError for any other failure.
    """
    mirror = find_mirror(repo_cache, task.repo)
    try:
        return _diff_tree(workdir, mirror, task.base_commit)
    except SpoolrlError as exc:
        problems = tree_problems(workdir)
        if problems:
            raise UnscorableTree(f"the work tree cannot be diffed: {'; '.join(problems)} ({exc})") from exc
        if _pristine_diffs(mirror, task.base_commit):
            raise UnscorableTree(f"the work tree cannot be diffed (a pristine checkout can): {exc}") from exc
        raise


def _diff_tree(workdir: Path, mirror: Path, base_commit: str) -> str:
    with tempfile.TemporaryDirectory(prefix="spoolrl-diff-") as tmp:
        git_dir = harness_git_dir(Path(tmp), mirror, base_commit)
        tree: list[str | os.PathLike[str]] = ["--git-dir", git_dir, "--work-tree", workdir.absolute()]
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        run_git([*tree, "read-tree", base_commit], env=index)
        run_git([*tree, "add", "-A", "--", "."], env=index, cwd=workdir)
        proc = run_git([*tree, "diff", "--cached", "--binary", "--no-ext-diff", "--no-textconv", "--no-color",
                        "--no-renames", base_commit], env=index, cwd=workdir)
    return proc.stdout.decode("utf-8", errors="surrogateescape")


def _pristine_diffs(mirror: Path, base_commit: str) -> bool:
    """The control experiment: does the harness diff a fresh checkout of ``base_commit`` (to nothing)?"""
    try:
        with tempfile.TemporaryDirectory(prefix="spoolrl-control-") as tmp:
            git_dir = harness_git_dir(Path(tmp), mirror, base_commit)
            tree = Path(tmp) / "tree"
            tree.mkdir()
            run_git(["--git-dir", git_dir, "--work-tree", tree, "checkout", "-q", "-f", base_commit, "--", "."],
                    env={"GIT_INDEX_FILE": str(Path(tmp) / "index")}, cwd=tree)
            return _diff_tree(tree, mirror, base_commit) == ""
    except (SpoolrlError, OSError):
        return False


def tree_problems(workdir: Path) -> list[str]:
    """Entries of the tree (its own ``.git`` aside) that git cannot diff, as made by the agent: FIFOs,
    sockets and devices, files without owner read permission, directories without owner read+search
    permission (or that cannot be listed), nested git repositories; at most :data:`MAX_PROBLEMS`."""
    found: list[str] = []
    root = workdir.absolute()
    try:
        if stat.S_IMODE(root.lstat().st_mode) & 0o700 != 0o700:
            found.append(". (the work dir) lacks owner rwx")
    except OSError:
        return []  # no work dir (or none we can see): nothing the agent made

    def unlistable(err: OSError) -> None:
        found.append(f"{Path(err.filename or '?').relative_to(root) if err.filename else '?'}: cannot be listed")

    for dirpath, dirnames, filenames in os.walk(root, onerror=unlistable):  # does not follow symlinks
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d != ".git"]
        elif ".git" in dirnames or ".git" in filenames:
            found.append(f"{here.relative_to(root)}: a nested git repository")
        for name in dirnames + filenames:
            why = _entry_problem(here / name)
            if why:
                found.append(f"{(here / name).relative_to(root)}: {why}")
        if len(found) >= MAX_PROBLEMS:
            break
    return found[:MAX_PROBLEMS]


def _entry_problem(path: Path) -> str:
    try:
        st = path.lstat()
    except OSError as exc:
        return exc.strerror or "cannot be read"
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return ""
    if stat.S_ISDIR(mode):
        return "" if stat.S_IMODE(mode) & 0o500 == 0o500 else "a directory without owner read/search permission"
    if stat.S_ISREG(mode):
        return "" if mode & stat.S_IRUSR else "a file without owner read permission"
    kind = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
            stat.S_IFBLK: "a block device"}.get(stat.S_IFMT(mode), "not a regular file")
    return f"{kind} (git diffs only regular files and symlinks)"
