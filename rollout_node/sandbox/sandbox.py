"""One episode's sandbox: a persistent shell, a python tool, file tools, fresh-process exec.

``open_sandbox(cfg, workdir, image=...)`` stages the image, starts the runtime's sandbox with an
interactive bash on a PTY (see ``pty_shell.py``) and returns a :class:`Sandbox` (a context
manager). The host ``workdir`` is the sandbox's ``/work`` (read-write); everything else of the
image is read-only. Guarantees:
- every tool call returns a :class:`ToolResult`; only infrastructure faults raise SandboxError;
- ``exec`` runs one fresh non-interactive process in a *separate* sandbox on the same image and
  work dir (no shell state, own /tmp): what EVAL uses;
- limits and the watchdog (``limits.py``) apply to the shell's sandbox and to every ``exec``;
  a watchdog kill is reported in the next result and the shell comes back fresh; past the episode's
  disk budget (``open_sandbox(disk_bytes=...)``) every later tool call raises SandboxError and
  :attr:`Sandbox.disk_verdict` says why (the caller scores that as the agent's outcome);
- ``close()`` is idempotent and leaves no process behind: the sandbox's whole process tree is
  SIGKILLed (for bwrap/apptainer the pid namespace guarantees that daemons started with
  setsid/nohup are in it); for the local runtime, processes carrying the sandbox's environment
  marker are hunted down as well.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hpc.config.sandbox import SandboxConfig
from hpc.errors import SandboxError
from hpc.paths import node_scratch, private_dir
from rollout_node.sandbox import spawner
from rollout_node.sandbox.files import FileTools
from rollout_node.sandbox.images import ImageCache, ImageLease, default_image
from rollout_node.sandbox.limits import NPROC_HEADROOM, Limits, PidsCgroup, Watchdog, descendants, kill_tree
from rollout_node.sandbox.pty_shell import BASH_ARGS, PtyShell, ShellLaunch, marker_env
from rollout_node.sandbox.pytool import SERVER_SOURCE, PyChannel
from rollout_node.sandbox.result import HeadTail, ToolResult, make_result
from rollout_node.sandbox.runtimes import Bind, LaunchSpec, Runtime, get_runtime

CTL_DIR = ".spoolrl"          # node <-> sandbox control files inside the work dir
SUBMIT_KEEP = 32 * 2**20      # a submitted diff is never truncated below this size
ENV_MARKER = "SPOOLRL_SANDBOX"
RESPAWN_WAIT_S = 5.0          # at most this long for a killed sandbox's processes to be released


class Sandbox:
    """Use through :func:`open_sandbox`. Not thread-safe: one episode drives one sandbox."""

    def __init__(self, cfg: SandboxConfig, workdir: Path, runtime: Runtime, image: ImageLease | None,
                 disk_bytes: int = 0) -> None:
        self.cfg, self.runtime, self._image = cfg, runtime, image
        self.workdir = Path(workdir).absolute()
        self.key = f"sbx-{os.getpid()}-{secrets.token_hex(4)}"
        self.limits = Limits.from_config(cfg)
        self.keep = cfg.max_output_kb * 1024
        self.scratch = user_scratch(cfg) / "sbx" / self.key
        self.submission: str | None = None
        self._closed = False
        self._disk_verdict = ""
        self._execs = 0
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.scratch.mkdir(parents=True, exist_ok=True)
        self._ctl_fd = _open_ctl_dir(self.workdir)
        self.inside = runtime.workdir_inside if runtime.isolated else str(self.workdir)
        self.files = FileTools(self.workdir, self.inside, self.keep, self.limits.max_file_bytes)
        self.py = PyChannel(self._ctl_fd, self.keep, self._in_shell_sandbox)
        self.shell = PtyShell(self._shell_launch, keep=self.keep, on_spawn=self._on_spawn,
                              on_death=self._on_death, why_dead=lambda pid: Watchdog.shared().verdict(self.key, pid),
                              before_respawn=self._before_respawn)
        _sweep_once()
        self.cgroup = PidsCgroup(self.key, self.limits.max_procs + NPROC_HEADROOM)
        Watchdog.shared().register(self.key, self.limits, disk_dirs=(self.workdir, self.scratch), disk_bytes=disk_bytes)
        self.startup_s = self.shell.spawn()

    # ---------------------------------------------------------------- launching
    def _spec(self, extra_env: dict[str, str], layer: str, binds: tuple[Bind, ...] = ()) -> LaunchSpec:
        env = {**extra_env, ENV_MARKER: self.key}
        layer_dir = self.scratch / layer
        shutil.rmtree(layer_dir, ignore_errors=True)
        return LaunchSpec(workdir=self.workdir, image=self._image.path if self._image else None,
                          scratch=self.scratch, layer=layer_dir, tmp_bytes=self.limits.tmp_bytes, env=env,
                          binds=binds)

    def _boot_script(self, then: str) -> str:
        # oom_score_adj from inside (inherited by every sandbox process): no preexec_fn on the node
        # side, so subprocess spawns with vfork instead of copying the node's page tables
        # Slurm's time-limit warning is the node's (spawner.WARNING_SIGNAL): ignored here as well, as
        # apptainer's starter resets the dispositions the launcher was given
        ulimits = self.limits.ulimit_script(nproc=self.runtime.isolated)
        return (f"trap '' {spawner.WARNING_SIGNAL}\necho 1000 > /proc/self/oom_score_adj\n"
                f"{ulimits} || exit 125\n{then}")

    def _shell_launch(self, nonce: str) -> ShellLaunch:
        self.py.setup()
        spec = self._spec({}, "shell")
        # The marker variables are exported by the boot script, not passed through the runtime:
        # apptainer rewrites PROMPT_COMMAND and evaluates $? in environment values.
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in marker_env(nonce).items())
        boot = self._boot_script(PyChannel.boot_snippet(f"{self.inside}/{CTL_DIR}", self.keep) + "\n"
                                 + exports + "exec " + shlex.join(BASH_ARGS))
        argv = self.cgroup.prefix() + self.runtime.argv(spec, ["/bin/sh", "-c", boot, "sh", SERVER_SOURCE])
        return ShellLaunch(argv=argv, env=self.runtime.host_env(spec), cwd=str(self.runtime.host_cwd(spec)))

    def _before_respawn(self) -> None:
        # back-off: kill/restart must not become a steady load
        time.sleep(Watchdog.shared().backoff_s(self.key))
        # a killed fork bomb's processes keep their pids charge until they are reaped (orphans by
        # the host's init, ~1.5 s here): a shell started into a full group cannot fork and dies
        self.cgroup.wait_released(RESPAWN_WAIT_S)

    def _on_spawn(self, pid: int) -> None:
        Watchdog.shared().add_root(self.key, pid)

    def _on_death(self, pid: int) -> None:
        Watchdog.shared().remove_root(self.key, pid)
        self.py.sandbox_restarted()

    def _in_shell_sandbox(self, pid: int) -> bool:
        return self.shell.pid is not None and pid in descendants([self.shell.pid])

    # ---------------------------------------------------------------- tools
    def run(self, command: str, *, timeout_s: float | None = None) -> ToolResult:
        """Run ``command`` in the persistent bash (cwd and environment persist)."""
        self._check_open()
        return self.shell.run(command, timeout_s or self.cfg.command_timeout_s)

    def python(self, code: str, *, timeout_s: float | None = None) -> ToolResult:
        """Run ``code`` in the persistent python interpreter inside the shell's sandbox."""
        self._check_open()
        if not self.shell.alive():
            self.shell.kill()
            self.shell.spawn()
        return self.py.call(code, timeout_s or self.cfg.command_timeout_s)

    def exec(self, argv: list[str], *, timeout_s: float | None = None, keep: int | None = None,
             env: dict[str, str] | None = None, binds: tuple[Bind, ...] = (),
             stop: Callable[[], bool] | None = None) -> ToolResult:
        """Run ``argv`` as one fresh non-interactive process in a fresh sandbox (same image, same /work), with
        extra variables ``env`` and mounts ``binds``; ``stop()`` turning true ends it like its timeout does
        (the whole tree is killed, ``timed_out`` is set)."""
        self._check_open()
        self._execs += 1
        spec = self._spec(env or {}, f"exec{self._execs}", binds)
        boot = self._boot_script('exec "$@"')
        full = self.cgroup.prefix() + self.runtime.argv(spec, ["/bin/sh", "-c", boot, "sh", *argv])
        try:
            return self._run_process(full, spec, timeout_s or self.cfg.command_timeout_s, keep or self.keep, stop)
        finally:
            if spec.layer is not None:
                shutil.rmtree(spec.layer, ignore_errors=True)

    def view(self, path: str, view_range: tuple[int, int] | None = None) -> ToolResult:
        return self.files.view(path, view_range)

    def create(self, path: str, text: str, *, overwrite: bool = False) -> ToolResult:
        return self.files.create(path, text, overwrite=overwrite)

    def str_replace(self, path: str, old: str, new: str) -> ToolResult:
        return self.files.str_replace(path, old, new)

    def insert(self, path: str, line: int, text: str) -> ToolResult:
        return self.files.insert(path, line, text)

    def submit(self, repo: str = ".", *, timeout_s: float = 120.0) -> ToolResult:
        """The agent is done: the diff of ``repo`` (relative to /work) against HEAD becomes ``submission``."""
        # add everything, then take the control dir back out: an ':(exclude)' pathspec would make git
        # fail when the dir is also in info/exclude (as INIT writes it)
        script = (f"cd {shlex.quote(repo)} && git add -A -- . && git reset -q -- {shlex.quote(CTL_DIR)} && "
                  "git -c core.quotepath=off diff --cached --binary HEAD")
        result = self.exec(["bash", "-c", script], timeout_s=timeout_s, keep=SUBMIT_KEEP)
        if result.exit_code == 0 and not result.truncated:
            self.submission = result.output
        return result

    # ---------------------------------------------------------------- processes
    def _run_process(self, argv: list[str], spec: LaunchSpec, timeout_s: float, keep: int,
                     stop: Callable[[], bool] | None = None) -> ToolResult:
        t0 = time.monotonic()
        buf = HeadTail(keep)
        try:
            env, cwd = self.runtime.host_env(spec), self.runtime.host_cwd(spec)
            full = spawner.launcher_prefix() + argv
            proc = spawner.spawn(lambda: subprocess.Popen(
                full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                cwd=cwd, start_new_session=True))
        except OSError as exc:
            raise SandboxError(f"could not start {argv[0]}: {exc}") from exc
        Watchdog.shared().add_root(self.key, proc.pid)
        timed_out = True
        try:
            timed_out = _pump(proc, buf, t0 + timeout_s, stop)
        finally:
            # After EOF an isolated runtime's launcher exits with its pid namespace (taking every
            # process of the sandbox along); otherwise something is still running: kill it all.
            if timed_out or not self.runtime.isolated or _wait(proc, 2.0) is None:
                kill_tree([proc.pid])
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
            Watchdog.shared().remove_root(self.key, proc.pid)
        code: int | None = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        note = Watchdog.shared().verdict(self.key, proc.pid)
        if timed_out or note:
            code = None
        return make_result(buf, code, time.monotonic() - t0, timed_out=timed_out, note=note)

    # ---------------------------------------------------------------- closing
    @property
    def disk_verdict(self) -> str:
        """Why the episode's disk budget broke ('' while within it): the episode is over, the agent's doing."""
        return Watchdog.shared().over_disk(self.key) if not self._closed else self._disk_verdict

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox is closed")
        if over := self.disk_verdict:
            raise SandboxError(f"the episode is over: {over}")

    def close(self) -> None:
        """Kill every process of this sandbox and release its resources (idempotent)."""
        if self._closed:
            return
        self._disk_verdict = Watchdog.shared().over_disk(self.key)
        self._closed = True
        self.shell.kill()
        if not self.runtime.isolated:
            _kill_marked(self.key)
        self.cgroup.remove()
        self.py.teardown()
        Watchdog.shared().unregister(self.key)
        _remove_ctl_dir(self.workdir, self._ctl_fd)
        if self._image:
            self._image.release()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and not sys.is_finalizing():
            self.close()


def _wait(proc: subprocess.Popen, timeout_s: float) -> int | None:
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None


def _pump(proc: subprocess.Popen, buf: HeadTail, deadline: float, stop: Callable[[], bool] | None = None) -> bool:
    """Copy the process's output into ``buf`` until EOF; True if the deadline passed (or ``stop()``) first."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or (stop is not None and stop()):
            return True
        if select.select([fd], [], [], min(left, 0.2 if stop is not None else 1.0))[0]:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return False
            buf.add(chunk)
            if buf.total > 2 * buf.keep:
                time.sleep(0.005)  # back-pressure a flood instead of burning the node's CPU


def _open_ctl_dir(workdir: Path) -> int:
    """Create <workdir>/.spoolrl afresh (a leftover symlink or file is removed) and open it."""
    wfd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            st = os.stat(CTL_DIR, dir_fd=wfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(CTL_DIR, dir_fd=wfd)
            else:
                os.unlink(CTL_DIR, dir_fd=wfd)
        except FileNotFoundError:
            pass
        os.mkdir(CTL_DIR, 0o700, dir_fd=wfd)
        return os.open(CTL_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=wfd)
    finally:
        os.close(wfd)


def _remove_ctl_dir(workdir: Path, ctl_fd: int) -> None:
    try:
        for name in os.listdir(ctl_fd):
            try:
                os.unlink(name, dir_fd=ctl_fd)
            except (IsADirectoryError, PermissionError):
                shutil.rmtree(name, dir_fd=ctl_fd, ignore_errors=True)
        st = os.fstat(ctl_fd)
        wfd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            here = os.stat(CTL_DIR, dir_fd=wfd, follow_symlinks=False)
            if (here.st_ino, here.st_dev) == (st.st_ino, st.st_dev):
                os.rmdir(CTL_DIR, dir_fd=wfd)
        finally:
            os.close(wfd)
    except OSError:
        pass  # the agent moved or filled it; it is inside the work dir either way
    finally:
        os.close(ctl_fd)


def _kill_marked(key: str) -> None:
    """Local runtime: SIGKILL our uid's processes whose environment carries this sandbox's marker."""
    needle = f"{ENV_MARKER}={key}".encode()
    for _ in range(5):
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != os.getpid():
                try:
                    with open(f"/proc/{name}/environ", "rb") as f:
                        if needle in f.read().split(b"\0"):
                            found.append(int(name))
                except OSError:
                    continue
        if not found:
            return
        kill_tree(found)


def sweep_orphans() -> list[int]:
    """SIGKILL the bwrap sandboxes of dead nodes (this uid's); the pids killed. A node runs it once, as it
    opens its first sandbox.

    The launcher's tether (``spawner.launcher_prefix``) kills bwrap with its node, but bwrap's clone
    child, the sandbox pid namespace's init, arms its own ``--die-with-parent`` only after setting up
    the mounts: a node SIGKILLed in that window leaves the init running under pid 1, unprivileged
    (root's pids-cgroup sweep finds it too). It is found by its argv, which names its sandbox key
    (``--setenv SPOOLRL_SANDBOX sbx-<node pid>-<hex>``) whose node pid no longer exists; killing it
    takes its whole namespace down. Assumes the nodes of this uid share this pid namespace (as
    Slurm steps do)."""
    needle = b"\0" + ENV_MARKER.encode() + b"\0sbx-"
    killed = []
    for name in os.listdir("/proc"):
        owner = _dead_owner(name, needle)
        if owner is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(name), signal.SIGKILL)
                killed.append(int(name))
    return killed


_sweep_once = functools.cache(sweep_orphans)


def _dead_owner(name: str, needle: bytes) -> int | None:
    """The node pid in /proc/NAME's sandbox key if the process is ours and that node is gone, else None."""
    try:
        if not name.isdigit() or os.stat(f"/proc/{name}").st_uid != os.getuid():
            return None
        with open(f"/proc/{name}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return None
    at = cmd.find(needle)
    owner = cmd[at + len(needle):].split(b"-", 1)[0] if at >= 0 else b""
    return int(owner) if owner.isdigit() and not os.path.exists(f"/proc/{int(owner)}") else None


def user_scratch(cfg: SandboxConfig) -> Path:
    """This user's node-local scratch (per uid: several users may share a node's $TMPDIR), checked to be
    ours (owner, mode, not a symlink: :func:`hpc.paths.private_dir`). Raises SandboxError."""
    try:
        return private_dir(node_scratch(cfg.scratch_dir) / f"spoolrl-{os.getuid()}")
    except OSError as exc:
        raise SandboxError(f"node-local scratch is unusable: {exc}") from exc


_warned_local = False


def warn_local() -> None:
    global _warned_local
    if _warned_local:
        return
    _warned_local = True
    print("\n" + "!" * 78 + "\n!! spoolrl sandbox runtime 'local': NO ISOLATION. Agent commands run as "
          f"{os.environ.get('USER', 'this user')}\n!! with full access to this machine's files, network "
          "and processes.\n" + "!" * 78, file=sys.stderr)


@contextmanager
def _closing_on_error(lease: ImageLease | None) -> Iterator[None]:
    try:
        yield
    except BaseException:
        if lease:
            lease.release()
        raise


def open_sandbox(cfg: SandboxConfig, workdir: Path, *, image: str | None = None, disk_bytes: int = 0) -> Sandbox:
    """Start an episode's sandbox on ``workdir`` (bound at /work). Raises SandboxError. ``disk_bytes`` > 0: the
    episode's disk budget (work dir + sandbox scratch; see :mod:`~rollout_node.sandbox.limits`)."""
    problems = cfg.check()
    if problems:
        raise SandboxError("; ".join(problems))
    runtime = get_runtime(cfg.runtime)
    lease = None
    if runtime.isolated:
        cache_dir = Path(cfg.image_cache_dir) if cfg.image_cache_dir else user_scratch(cfg) / "images"
        lease = ImageCache(cache_dir, int(cfg.image_cache_gb * 2**30)).stage(image or cfg.image or default_image())
    else:
        warn_local()
    with _closing_on_error(lease):
        return Sandbox(cfg, Path(workdir), runtime, lease, disk_bytes)
