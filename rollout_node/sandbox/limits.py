"""Per-sandbox limits without cgroups: rlimits set inside the sandbox plus a watchdog thread.

Guarantees:
- Every sandbox process gets ``oom_score_adj = 1000`` (set by the sandbox's first shell,
  inherited), so under memory pressure the kernel kills sandbox processes before the node process.
- rlimits (CPU seconds, address space, file size, processes) are set by the first shell inside
  the sandbox (``ulimit`` soft = hard, so the agent cannot raise them). Inside a user namespace
  (bwrap, apptainer) the kernel counts RLIMIT_NPROC per (user namespace, uid), i.e. per sandbox,
  not per node user; the local runtime gets no process limit from rlimits (it would count every
  process of the uid) and relies on the watchdog alone.
- One watchdog thread per node process scans /proc every ``interval_s`` (0.2 s), sums the memory
  of each registered sandbox (:func:`sandbox_memory`: anonymous and shared memory its processes map,
  i.e. MAP_SHARED, memfd, SysV shm, from ``Pss_Anon + Pss_Shmem``; memfds held open but unmapped;
  the contents of the tmpfs mounts of its mount namespaces, the shell's and each exec's, ``/tmp``,
  ``/dev/shm`` included) and
  counts the tasks (processes and threads, as RLIMIT_NPROC does) of its process tree,
  and kills a tree that exceeds ``mem_bytes`` or ``max_procs``; the owner of each killed process
  learns why through :meth:`Watchdog.verdict`. A fork bomb is capped by RLIMIT_NPROC first, then killed. A sandbox
  past half of a limit first gets the lowest CPU weight for its scheduler autogroup (each sandbox
  launch is its own session, hence its own autogroup when ``kernel.sched_autogroup_enabled``).
  A sandbox the watchdog killed once starts every later shell demoted (penalty box), and its
  restarts back off (0.5 s doubling to 5 s) so a kill/restart loop cannot become a steady load.
  As root RLIMIT_NPROC does not apply (the kernel exempts uid 0): root gets a cgroup-v1 pids
  group per sandbox instead (:class:`PidsCgroup`).
- Not counted: SysV segments no process has attached, tmpfs of a runtime that shares the
  node's mount namespace (``local``), and a tmpfs the node's own mount table also holds (not the
  sandbox's alone; a launcher still setting up sees the node's mounts), nor one whose path no longer
  leads to the device the table named (:func:`_used_on`). A tmpfs file that is also mapped counts
  twice (on the safe side).
- Disk budget: a sandbox registered with ``disk_dirs`` and ``disk_bytes`` (the episode's work dir and
  its private scratch, ``rollout.scratch_per_episode_gb``) has those trees measured every
  ``DISK_EVERY`` scans, and no sooner than ``DISK_DUTY`` times the last walk took (:func:`tree_bytes`: allocated blocks, symlinks not followed); past the budget
  its processes are killed and :meth:`Watchdog.over_disk` names why from then on (the sandbox ends
  the episode: the files stay, so a fresh shell would not help). Not counted: what lies under a
  directory the agent made unreadable to its owner (the walk cannot list it); ``max_file_mb``
  still caps every single file.
- :func:`kill_tree` SIGKILLs a whole process tree (repeatedly, until nothing of it is left).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hpc.config.sandbox import SandboxConfig

PAGE = os.sysconf("SC_PAGE_SIZE")
DISK_EVERY = 5  # scans between two disk measurements (a walk of the tree costs more than a /proc scan)
DISK_DUTY = 20  # and at least 20x the last walk's duration: a tree of 10^5 files costs at most ~5 % of a core
NPROC_HEADROOM = 8  # RLIMIT_NPROC sits a little above max_procs so that the watchdog sees the offence


@dataclass(frozen=True)
class Limits:
    mem_bytes: int
    cpu_time_s: int
    max_procs: int
    max_file_bytes: int
    tmp_bytes: int

    @classmethod
    def from_config(cls, cfg: SandboxConfig) -> Limits:
        mem = int(cfg.mem_gb * 2**30)
        return cls(mem_bytes=mem, cpu_time_s=cfg.cpu_time_s, max_procs=cfg.max_procs,
                   max_file_bytes=cfg.max_file_mb * 2**20, tmp_bytes=int(cfg.tmp_mb * 2**20))

    def ulimit_script(self, *, nproc: bool) -> str:
        """POSIX-shell ``ulimit`` commands (soft = hard; bash or dash) to run first inside the sandbox."""
        parts = [f"-t {self.cpu_time_s}", f"-v {self.mem_bytes // 1024}", f"-f {self.max_file_bytes // 512}"]
        script = " && ".join(f"ulimit {p}" for p in parts)
        if nproc:  # bash calls it -u, dash -p (bash's -p is the pipe size, which it refuses to set)
            n = self.max_procs + NPROC_HEADROOM
            script += f" && {{ ulimit -u {n} 2>/dev/null || ulimit -p {n}; }}"
        return script


class PidsCgroup:
    """Root only: a cgroup-v1 ``pids`` group per sandbox with ``pids.max``.

    The kernel exempts uid 0 from RLIMIT_NPROC (even inside a user namespace), so a fork bomb in
    a sandbox started by root would grow until the watchdog's next scan, by then thousands of
    processes. Root can create pids cgroups without delegation, so it gets a kernel-enforced cap;
    an unprivileged node relies on RLIMIT_NPROC (per user namespace) instead.
    """

    ROOT = Path("/sys/fs/cgroup/pids")

    def __init__(self, key: str, max_tasks: int) -> None:
        self.path: Path | None = None
        if os.geteuid() != 0 or not os.access(self.ROOT, os.W_OK):
            return
        self._sweep()
        try:
            path = self.ROOT / f"spoolrl-{key}"
            path.mkdir(exist_ok=True)
            (path / "pids.max").write_text(str(max_tasks))
            self.path = path
        except OSError:
            self.path = None

    def _sweep(self) -> None:
        """Clear groups left by node processes that died without closing (named spoolrl-sbx-<pid>-...).

        What is still in such a group is an orphaned sandbox: a node SIGKILLed while it started one
        can leave the sandbox's bwrap running under init (its ``--die-with-parent`` came too late;
        found by scripts/soak.py). It is SIGKILLed; the group goes once its processes are reaped (this
        sweep or a later one; nothing waits here)."""
        for group in self.ROOT.glob("spoolrl-sbx-*"):
            try:
                owner = int(group.name.split("-")[2])
                if Path(f"/proc/{owner}").exists():
                    continue
                for pid in (int(x) for x in (group / "cgroup.procs").read_text().split()):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                group.rmdir()  # fails until the killed processes are reaped
            except (ValueError, IndexError, OSError):
                continue

    def prefix(self) -> list[str]:
        """argv prefix that moves the launcher into the group before it execs (children inherit)."""
        if self.path is None:
            return []
        # "0" into ``tasks`` moves the calling (single-threaded) shell itself: the kernel then skips
        # the global threadgroup lock that a pid written to cgroup.procs takes, whose RCU grace
        # period cost every sandbox start ~10 ms here (scripts/bench_tools.py --only cold).
        return ["/bin/sh", "-c", 'echo 0 > "$0/tasks" && exec "$@"', str(self.path)]

    def wait_released(self, timeout_s: float) -> int:
        """Wait until at most NPROC_HEADROOM // 2 tasks are charged to the group (a killed tree's
        processes are charged until reaped); returns the count left (0 without a group)."""
        if self.path is None:
            return 0
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                left = int((self.path / "pids.current").read_text())
            except (OSError, ValueError):
                return 0
            if left <= NPROC_HEADROOM // 2 or time.monotonic() >= deadline:
                return left
            time.sleep(0.01)

    def remove(self) -> None:
        if self.path is None:
            return
        for _ in range(100):
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
        try:
            self.path.rmdir()
        except OSError:
            pass
        self.path = None


# ---------------------------------------------------------------- process table

def _ppid_table(threads: dict[int, int] | None = None) -> dict[int, int]:
    """pid -> ppid for every process visible in /proc (one read of /proc/PID/stat each);
    fills ``threads`` (pid -> number of threads) when given."""
    table: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        # comm may contain spaces and parentheses: split after the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        table[int(name)] = int(fields[1])
        if threads is not None:
            threads[int(name)] = int(fields[17])
    return table


def descendants(roots: Iterable[int], table: dict[int, int] | None = None) -> list[int]:
    """The roots that still exist and all their descendants (parents before children)."""
    table = _ppid_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, ppid in table.items():
        children.setdefault(ppid, []).append(pid)
    out = [r for r in roots if r in table]
    i = 0
    while i < len(out):
        out.extend(children.get(out[i], ()))
        i += 1
    return out


def resident_bytes(pid: int) -> int:
    """Anonymous plus shared-memory pages a process maps (``Pss_Anon + Pss_Shmem`` of smaps_rollup:
    MAP_SHARED anonymous memory, mapped memfds and SysV segments, shared pages split between their
    users); statm's resident - shared where smaps_rollup lacks those fields; 0 if the process is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            text = f.read()
    except OSError:
        return anon_rss(pid)
    fields = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(b":")
        if name in (b"Pss_Anon", b"Pss_Shmem"):
            fields[name] = int(rest.split()[0]) * 1024
    return sum(fields.values()) if len(fields) == 2 else anon_rss(pid)


def memfd_bytes(pids: Iterable[int]) -> int:
    """Pages held by memfds the processes have open (each file once, mapped or not)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if not os.readlink(f"{fd_dir}/{fd}").startswith("/memfd:"):
                    continue
                st = os.stat(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def node_tmpfs() -> set[bytes]:
    """The devices of the tmpfs mounts in this process's own mount table (never a sandbox's alone)."""
    with open("/proc/self/mountinfo", "rb") as f:
        return {dev for dev, _ in _tmpfs_mounts(f.read().splitlines())}


def tmpfs_bytes(pids: Iterable[int], shared: Callable[[], set[bytes]] = node_tmpfs) -> int:
    """Bytes stored in the tmpfs mounts (``/tmp``, ``/dev`` with ``/dev/shm``, ...) of every mount
    namespace among ``pids`` that is not the node's own (the shell's sandbox and each ``exec``
    sandbox, e.g. an EVAL, have their own); 0 if there is none.

    Each tmpfs counts once, by its device, and only one the node's own mount table does not hold
    (``shared()``: :func:`node_tmpfs`, which the watchdog caches per scan; called only once a
    namespace of its own is found, so a scan with none reads no mount table):
    a launcher between ``unshare(CLONE_NEWNS)`` and the end of its set-up sees a copy of the node's
    mounts, which are not the sandbox's alone. See :func:`_used_on` for a table read mid-setup."""
    own = os.readlink("/proc/self/ns/mnt")
    seen: set[bytes] | None = None
    spaces: set[str] = set()
    total = 0
    for pid in pids:
        try:
            space = os.readlink(f"/proc/{pid}/ns/mnt")
            if space == own or space in spaces:
                continue
            with open(f"/proc/{pid}/mountinfo", "rb") as f:
                theirs = f.read().splitlines()
        except OSError:
            continue
        spaces.add(space)
        if seen is None:
            seen = set(shared())
        total += _tmpfs_used(pid, theirs, seen)
    return total


def _tmpfs_mounts(mountinfo: list[bytes]) -> list[tuple[bytes, str]]:
    """(device, mount point) of every tmpfs line of a mountinfo table."""
    out = []
    for line in mountinfo:
        pre, _, post = line.partition(b" - ")
        if post.startswith(b"tmpfs "):
            fields = pre.split()
            out.append((fields[2], fields[4].decode(errors="replace").replace("\\040", " ")))
    return out


def _tmpfs_used(pid: int, mountinfo: list[bytes], seen: set[bytes]) -> int:
    """Bytes on the tmpfs mounts of ``pid``'s table whose device is not in ``seen`` (updated)."""
    total = 0
    for dev, mountpoint in _tmpfs_mounts(mountinfo):
        if dev in seen:
            continue  # the node's (not the sandbox's alone), or a second mount of one already counted
        used = _used_on(f"/proc/{pid}/root{mountpoint}", dev)
        if used is not None:
            seen.add(dev)
            total += used
    return total


def _used_on(path: str, dev: bytes) -> int | None:
    """Bytes used on the filesystem at ``path`` if that is still device ``dev`` (mountinfo's
    ``major:minor``), else None.

    The table was read a moment before: a launcher setting up moves its mounts meanwhile. bwrap's
    base tmpfs is its ``/`` until the last ``pivot_root``, after which ``/`` is the image on the
    host's disk; a table read before it and measured after it charged the disk's used space
    ("memory 54942 MiB > limit 4096 MiB": an EVAL sandbox killed before its runner printed). The
    device is checked and the usage read on one descriptor, so nothing can move in between."""
    major, _, minor = dev.partition(b":")
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_dev != os.makedev(int(major), int(minor)):
            return None
        st = os.fstatvfs(fd)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def sandbox_memory(pids: list[int], shared_tmpfs: Callable[[], set[bytes]] = node_tmpfs) -> int:
    """What one sandbox holds in RAM: mapped anonymous + shared memory of its processes, its open
    memfds, and the contents of the tmpfs mounts of its own mount namespace (see :func:`tmpfs_bytes`)."""
    return sum(resident_bytes(p) for p in pids) + memfd_bytes(pids) + tmpfs_bytes(pids, shared_tmpfs)


def tree_bytes(roots: Iterable[Path]) -> int:
    """Bytes allocated on disk by the files under ``roots`` (lstat blocks; unreadable entries count 0)."""
    total, stack = 0, [str(r) for r in roots]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                    except OSError:
                        continue
        except OSError:
            continue
    return total


def anon_rss(pid: int) -> int:
    """Resident memory minus file-backed/shared pages (bytes); 0 if the process is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            fields = f.read().split()
        return max(0, int(fields[1]) - int(fields[2])) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def kill_tree(roots: Iterable[int], *, rounds: int = 50) -> None:
    """SIGKILL every process of the trees under ``roots`` until none is left (bounded rounds)."""
    roots = list(roots)
    for _ in range(rounds):
        pids = descendants(roots)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        # the roots are reaped by their owners (Popen/ptyprocess); a zombie counts as gone
        pids = [p for p in descendants(roots) if not _is_zombie(p)]
        if not pids:
            return
        time.sleep(0.01)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rfind(b")") + 2:][:1] == b"Z"
    except OSError:
        return True


# ---------------------------------------------------------------- watchdog

def _demote(roots: list[int]) -> set[int]:
    """Lowest CPU weight for a sandbox's scheduler autogroup (one per session, i.e. per sandbox
    launch): a sandbox heading for its limits stops slowing its neighbours even before it is killed.
    Returns the roots demoted. A root still in the node's own session (a launcher that has not
    called setsid yet) is skipped: demoting it would demote the node itself."""
    done = set()
    own_session = os.getsid(0)
    for pid in roots:
        try:
            if os.getsid(pid) == own_session:
                continue
            with open(f"/proc/{pid}/autogroup", "w") as f:
                f.write("19")
            done.add(pid)
        except OSError:
            pass  # gone, or no autogroup support (CONFIG_SCHED_AUTOGROUP off or disabled)
    return done


@dataclass
class _Watched:
    roots: set[int]
    limits: Limits
    on_kill: Callable[[str], None] | None
    verdicts: dict[int, str] = field(default_factory=dict)  # killed root pid -> why
    demoted: set[int] = field(default_factory=set)
    kills: int = 0
    disk_dirs: tuple[Path, ...] = ()
    disk_bytes: int = 0
    scans: int = 0
    disk_next: float = 0.0
    over_disk: str = ""


class Watchdog:
    """One background thread per process that polices every registered sandbox's process tree."""

    _instance: Watchdog | None = None
    _instance_lock = threading.Lock()

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._watched: dict[str, _Watched] = {}
        self._thread: threading.Thread | None = None

    @classmethod
    def shared(cls) -> Watchdog:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def register(self, key: str, limits: Limits, on_kill: Callable[[str], None] | None = None, *,
                 disk_dirs: tuple[Path, ...] = (), disk_bytes: int = 0) -> None:
        """Watch sandbox ``key``; ``disk_bytes`` > 0 also holds ``disk_dirs`` to that budget."""
        with self._lock:
            self._watched[key] = _Watched(set(), limits, on_kill, disk_dirs=disk_dirs, disk_bytes=disk_bytes)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="sandbox-watchdog", daemon=True)
                self._thread.start()

    def add_root(self, key: str, pid: int) -> None:
        """Watch the tree under ``pid`` (a sandbox the watchdog killed before is demoted at its next scan)."""
        with self._lock:
            self._watched[key].roots.add(pid)

    def remove_root(self, key: str, pid: int) -> None:
        with self._lock:
            if key in self._watched:
                self._watched[key].roots.discard(pid)

    def unregister(self, key: str) -> None:
        with self._lock:
            self._watched.pop(key, None)

    def verdict(self, key: str, root: int) -> str:
        """Why the watchdog killed the tree of ``root`` ('' if it did not); cleared by reading. Per root:
        a kill that ended the shell between commands is not reported by a later ``exec``, and the
        reverse."""
        with self._lock:
            w = self._watched.get(key)
            return w.verdicts.pop(root, "") if w else ""

    def over_disk(self, key: str) -> str:
        """Why this sandbox's trees broke their disk budget ('' while within it); never cleared."""
        with self._lock:
            w = self._watched.get(key)
            return w.over_disk if w else ""

    def backoff_s(self, key: str) -> float:
        """Delay before restarting a sandbox the watchdog killed: 0.5 s, doubling per kill, at most 5 s."""
        with self._lock:
            w = self._watched.get(key)
            kills = w.kills if w else 0
        return 0.0 if kills == 0 else min(5.0, 0.5 * 2 ** (kills - 1))

    def _loop(self) -> None:
        hot = False
        while True:
            # a sandbox near its limits is looked at twice as often (fork bombs grow fast)
            time.sleep(self.interval_s / 2 if hot else self.interval_s)
            with self._lock:
                if not self._watched:
                    self._thread = None
                    return
                items = [(k, w, list(w.roots)) for k, w in self._watched.items() if w.roots]
            hot = self.check_once(items) if items else False

    def check_once(self, items: list[tuple[str, _Watched, list[int]]]) -> bool:
        """One scan; True if some sandbox is past half of a limit."""
        hot = False
        threads: dict[int, int] = {}
        table = _ppid_table(threads)
        shared = functools.cache(node_tmpfs)  # read at most once per scan, and only if some sandbox needs it
        for _key, w, roots in items:
            pids = descendants(roots, table)
            mem = sandbox_memory(pids, shared)
            # RLIMIT_NPROC counts tasks (threads), so the watchdog does too
            tasks = sum(threads.get(p, 1) for p in pids)
            near = tasks > w.limits.max_procs // 2 or mem > w.limits.mem_bytes // 2
            hot = hot or near
            if (w.kills or near) and not set(roots) <= w.demoted:
                w.demoted |= _demote([r for r in roots if r not in w.demoted])
            why, disk = "", self._disk_check(w)
            if tasks >= w.limits.max_procs:
                why = f"{tasks} processes/threads >= max_procs {w.limits.max_procs}"
            elif mem > w.limits.mem_bytes:
                why = f"memory {mem / 2**20:.0f} MiB > limit {w.limits.mem_bytes / 2**20:.0f} MiB"
            elif disk:
                why = disk
            if why:
                verdict = f"sandbox killed by the watchdog: {why}"
                with self._lock:  # the verdict first: the owner asks for it as soon as its shell dies
                    w.over_disk = w.over_disk or disk
                    w.verdicts.update(dict.fromkeys(roots, verdict))
                    w.kills += 1
                kill_tree(roots)
                if w.on_kill:
                    w.on_kill(verdict)
        return hot


    @staticmethod
    def _disk_check(w: _Watched) -> str:
        """Every DISK_EVERY scans: the reason if the sandbox's trees exceed their budget, else ''."""
        w.scans += 1
        if not w.disk_bytes or w.scans % DISK_EVERY or time.monotonic() < w.disk_next:
            return ""
        t0 = time.monotonic()
        used = tree_bytes(w.disk_dirs)
        w.disk_next = time.monotonic() + DISK_DUTY * (time.monotonic() - t0)
        if used <= w.disk_bytes:
            return ""
        return f"disk budget: {used / 2**20:.0f} MiB on disk > {w.disk_bytes / 2**20:.0f} MiB per episode"


def _forget_watchdog_in_child() -> None:
    # a forked child inherits neither the thread nor the sandboxes: start from scratch
    Watchdog._instance = None
    Watchdog._instance_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_watchdog_in_child)
