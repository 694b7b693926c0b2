"""Pure and near-pure parts: result buffers, limits, runtime argv (golden), the image cache,
process-tree killing and the node-side file tools' path safety. No sandbox needed."""

from __future__ import annotations

import os
import signal
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest

from hpc.config.sandbox import SandboxConfig
from rollout_node.sandbox import default_image
from rollout_node.sandbox.files import FileTools
from rollout_node.sandbox.images import ImageCache
from rollout_node.sandbox.limits import Limits, _tmpfs_used, descendants, kill_tree
from rollout_node.sandbox.result import HeadTail, make_result
from rollout_node.sandbox.runtimes import ApptainerRuntime, BwrapRuntime, LaunchSpec

SPEC = LaunchSpec(workdir=Path("/scratch/ep 1"), image=Path("/img/root"), scratch=Path("/scratch/s"),
                  layer=None, tmp_bytes=1024, env={"SPOOLRL_SANDBOX": "k"})


def test_head_tail_keeps_both_ends_and_counts() -> None:
    buf = HeadTail(4)
    for chunk in (b"abc", b"defgh", b"ijklmnop", b"qr"):
        buf.add(chunk)
    assert buf.total == 18 and buf.truncated
    r = make_result(buf, 0, 0.1)
    assert r.output.startswith("abcd") and r.output.endswith("opqr") and "10 bytes truncated" in r.output
    small = HeadTail(8)
    small.add(b"12345678")
    assert not small.truncated and small.text() == "12345678"


def test_ulimit_script_soft_equals_hard() -> None:
    lim = Limits.from_config(SandboxConfig(mem_gb=1.0, cpu_time_s=10, max_procs=32, max_file_mb=2))
    assert lim.ulimit_script(nproc=True) == ("ulimit -t 10 && ulimit -v 1048576 && ulimit -f 4096 && "
                                             "{ ulimit -u 40 2>/dev/null || ulimit -p 40; }")
    assert "-u" not in lim.ulimit_script(nproc=False)


def test_bwrap_argv_golden() -> None:
    argv = BwrapRuntime(binary="/usr/bin/bwrap").argv(SPEC, ["bash", "-i"])
    assert argv == [
        "/usr/bin/bwrap", "--ro-bind", "/img/root", "/", "--dev", "/dev", "--proc", "/proc",
        "--size", "1024", "--tmpfs", "/tmp", "--size", "1024", "--tmpfs", "/var/tmp", "--size", "1024", "--tmpfs", "/run",
        "--bind", "/scratch/ep 1", "/work", "--unshare-all", "--unshare-user", "--disable-userns",
        "--die-with-parent", "--cap-drop", "ALL", "--hostname", "sandbox", "--clearenv",
        "--setenv", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "--setenv", "HOME", "/work",
        "--setenv", "TERM", "dumb", "--setenv", "LANG", "C.UTF-8", "--setenv", "HISTFILE", "/dev/null",
        "--setenv", "SPOOLRL_SANDBOX", "k", "--chdir", "/work", "--", "bash", "-i"]


def test_apptainer_argv_golden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    spec = LaunchSpec(workdir=Path("/w"), image=Path("/img"), scratch=tmp_path, layer=tmp_path / "layer",
                      env={"SPOOLRL_SANDBOX": "k"})
    rt = ApptainerRuntime(binary="/opt/apptainer")
    assert rt.argv(spec, ["true"]) == [
        "/opt/apptainer", "--silent", "exec", "--containall", "--cleanenv", "--net", "--network", "none",
        "--uts", "--hostname", "sandbox", "--no-mount", "home,cwd",
        "--overlay", str(tmp_path / "layer/overlay"), "--workdir", str(tmp_path / "layer/work"),
        "--bind", "/w:/work", "--pwd", "/work", "/img", "true"]
    env = rt.host_env(spec)
    assert env["APPTAINER_CACHEDIR"].startswith(str(tmp_path)) and env["APPTAINER_TMPDIR"].startswith(str(tmp_path))
    assert env["APPTAINERENV_SPOOLRL_SANDBOX"] == "k" and "HF_TOKEN" not in env


def test_default_image_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOOLRL_IMAGE", "/x/y")
    assert default_image() == "/x/y"
    monkeypatch.delenv("SPOOLRL_IMAGE")
    monkeypatch.setenv("SPOOLRL_CACHE", "/c")
    assert default_image() == "/c/images/bookworm-test"


def _tarball(path: Path, payload: int) -> Path:
    src = path.parent / (path.name + ".src")
    (src / "usr/bin").mkdir(parents=True)
    (src / "usr/bin/tool").write_bytes(os.urandom(payload))
    with tarfile.open(path, "w") as tar:
        tar.add(src, arcname=".")
    return path


def test_image_cache_stages_once_concurrently(tmp_path: Path) -> None:
    tar = _tarball(tmp_path / "img.tar", 1000)
    cache = ImageCache(tmp_path / "cache", budget_bytes=10**9)
    leases = []
    threads = [threading.Thread(target=lambda: leases.append(cache.stage(str(tar)))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({lease.path for lease in leases}) == 1
    root = leases[0].path
    assert (root / "usr/bin/tool").stat().st_size == 1000 and (root / "work").is_dir()
    assert len(cache.entries()) == 1 and not list((tmp_path / "cache").glob("*.tmp*"))
    for lease in leases:
        lease.release()


def test_image_cache_says_whether_an_archive_is_staged(tmp_path: Path) -> None:
    tar = _tarball(tmp_path / "img.tar", 100)
    cache = ImageCache(tmp_path / "cache", budget_bytes=10**9)
    assert not cache.is_staged(tar)
    cache.stage(str(tar)).release()
    assert cache.is_staged(tar)
    assert not cache.is_staged(_tarball(tmp_path / "other.tar", 100))


def test_image_cache_evicts_lru_but_not_held(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path / "cache", budget_bytes=150_000)
    a = cache.stage(str(_tarball(tmp_path / "a.tar", 60_000)))
    time.sleep(0.01)
    b = cache.stage(str(_tarball(tmp_path / "b.tar", 60_000)))
    b.release()
    time.sleep(0.01)
    c = cache.stage(str(_tarball(tmp_path / "c.tar", 60_000)))  # over budget: b (LRU, unheld) goes
    names = {p.name.split("-")[0] for _, _, p in cache.entries()}
    assert names == {"a", "c"}, names  # a is older than b but held by a running sandbox
    a.release()
    c.release()


def test_kill_tree_kills_descendants_including_new_sessions() -> None:
    proc = subprocess.Popen(["bash", "-c", "sleep 300 & setsid sleep 301 & sleep 302"])
    time.sleep(0.3)
    assert len(descendants([proc.pid])) >= 4
    kill_tree([proc.pid])
    proc.wait(5)
    assert descendants([proc.pid]) == []


def test_file_tools_refuse_escapes(tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("TOPSECRET")
    (work / "link").symlink_to(outside / "secret")
    (work / "inner").symlink_to("sub/file")  # a symlink that stays inside is followed
    (work / "sub").mkdir()
    (work / "sub/file").write_text("inside\n")
    (work / "up").symlink_to("..")
    tools = FileTools(work, "/work", keep=4096, max_file_bytes=10**6)
    assert tools.view("inner").output == "     1\tinside\n     2\t\n"
    for r in (tools.view("link"), tools.view("up/outside/secret"), tools.view("/work/../outside/secret"),
              tools.create("up/new", "x"), tools.str_replace("link", "TOP", "x")):
        assert r.exit_code == 1 and "TOPSECRET" not in r.output, r
    assert (outside / "secret").read_text() == "TOPSECRET" and not (tmp_path / "new").exists()


def test_tmpfs_accounting_counts_only_the_sandboxs_own_tmpfs(tmp_path: Path) -> None:
    """A tmpfs the node's mount table also holds is not the sandbox's (a launcher still setting up
    sees the node's mounts); a tmpfs mounted twice counts once. Measured on this process's /dev/shm
    holding a 4 MiB file."""
    blob = Path("/dev/shm") / f"spoolrl-units-{os.getpid()}"
    blob.write_bytes(b"x" * (4 << 20))
    try:
        line = _visible_shm_line()
        dev = line.split()[2]
        alone = _tmpfs_used(os.getpid(), [line], set())
        assert alone >= 4 << 20
        assert _tmpfs_used(os.getpid(), [line, line], set()) == alone  # the same device once
        assert _tmpfs_used(os.getpid(), [line], {dev}) == 0  # the node's own tmpfs
    finally:
        blob.unlink()


def _visible_shm_line() -> bytes:
    """This process's mountinfo line of the tmpfs that /dev/shm leads to (it may be mounted over another)."""
    st_dev = os.stat("/dev/shm").st_dev
    return next(x for x in Path("/proc/self/mountinfo").read_bytes().splitlines()
                if x.split()[4] == b"/dev/shm" and b" - tmpfs " in x
                and x.split()[2] == f"{os.major(st_dev)}:{os.minor(st_dev)}".encode())


def test_tmpfs_accounting_measures_only_the_mount_the_table_named() -> None:
    """A mount table read while bwrap sets up lists its base tmpfs at '/'; measured after bwrap's last
    pivot_root, '/' is the image on the host's disk, whose used space was charged as the sandbox's
    memory (an EVAL sandbox killed before its runner printed anything). A path that no longer leads to
    the table's device counts 0. Here: a tmpfs line moved to '/', where this process has its disk."""
    fields = _visible_shm_line().split(b" ")
    fields[4] = b"/"
    stale = b" ".join(fields)
    disk = os.statvfs("/")
    assert os.stat("/").st_dev != os.stat("/dev/shm").st_dev and disk.f_blocks > disk.f_bfree
    assert _tmpfs_used(os.getpid(), [stale], set()) == 0


def test_a_shell_that_cannot_be_restarted_keeps_the_watchdogs_reason(tmp_path: Path) -> None:
    """A watchdog kill whose restart fails still names the kill (the agent's outcome), and the back-off
    hook runs before the restart attempt, only after a watchdog kill."""
    from rollout_node.sandbox.pty_shell import BASH_ARGS, PtyShell, ShellLaunch, marker_env

    starts: list[str] = []

    def launch(nonce: str) -> ShellLaunch:
        starts.append(nonce)
        argv = ["bash", *BASH_ARGS[1:]] if len(starts) == 1 else ["sh", "-c", "echo no room >&2; exit 1"]
        return ShellLaunch(argv=argv, env={"PATH": os.environ["PATH"], **marker_env(nonce)}, cwd=str(tmp_path))

    hooks: list[int] = []
    shell = PtyShell(launch, keep=4096, why_dead=lambda pid: "sandbox killed by the watchdog: 70 processes",
                     before_respawn=lambda: hooks.append(len(starts)))
    shell.spawn()
    assert shell.run("echo up", 5).output == "up\n"
    result = shell.run("kill -9 $$", 5)
    assert "sandbox killed by the watchdog: 70 processes; it could not be restarted" in result.output, result
    assert "no room" in result.output and hooks == [1], (result, hooks)
    assert shell.proc is None
    shell.kill()


@pytest.mark.skipif(os.geteuid() != 0, reason="pids cgroups are created by root only")
def test_pids_group_waits_for_killed_processes_to_be_released() -> None:
    """Zombies keep their pids charge until reaped: the wait sees them, and ends once they are."""
    from rollout_node.sandbox.limits import NPROC_HEADROOM, PidsCgroup

    group = PidsCgroup(f"sbx-{os.getpid()}-unit", 64)
    assert group.path is not None
    # the parent leaves 10 exited children unreaped, then sleeps
    proc = subprocess.Popen([*group.prefix(), "python3", "-c",
                             "import os, time\nfor _ in range(10):\n    os.fork() or os._exit(0)\ntime.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while int((group.path / "pids.current").read_text()) < 11 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert group.wait_released(0.2) >= 11
        proc.kill()
        proc.wait()
        assert group.wait_released(10) <= NPROC_HEADROOM // 2
    finally:
        proc.kill()
        proc.wait()
        group.remove()


def test_tmpfs_of_every_sandbox_namespace_counts(tmp_path: Path) -> None:
    """The shell's sandbox and an ``exec`` sandbox (an EVAL) each have their own /tmp: both count.
    Two real bwrap sandboxes, each holding 8 MiB in its tmpfs /tmp."""
    from rollout_node.sandbox.limits import node_tmpfs, tmpfs_bytes
    from rollout_node.sandbox.runtimes import find_bwrap

    bwrap = find_bwrap()
    assert bwrap, "bwrap is part of the test setup (scripts/test.sh installs it)"
    script = "head -c 8388608 /dev/zero > /tmp/blob && echo ready && exec sleep 60"
    procs = [subprocess.Popen([bwrap, "--ro-bind", "/", "/", "--tmpfs", "/tmp", "--dev", "/dev", "--proc", "/proc",
                               "--unshare-pid", "--die-with-parent", "sh", "-c", script],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        reads: list[int] = []

        def node_table() -> set[bytes]:
            reads.append(1)
            return node_tmpfs()

        one = tmpfs_bytes([procs[0].pid, *descendants([procs[0].pid])], node_table)
        both = tmpfs_bytes([p.pid for p in procs] + descendants([p.pid for p in procs]), node_table)
        assert one >= 8 << 20 and both >= 2 * one - (1 << 20), (one, both)
        assert len(reads) == 2, reads  # the node's table once per call, not once per namespace
        # processes in the node's own namespace only: no mount table is read at all
        assert tmpfs_bytes([os.getpid()], node_table) == 0 and len(reads) == 2, reads
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="pids cgroups are created by root only")
def test_pids_group_of_a_dead_node_is_cleared_with_its_orphans() -> None:
    """A node SIGKILLed while it started a sandbox can leave that sandbox running under init in the
    node's group (scripts/soak.py found one): the next node's sweep kills it, then removes the group."""
    from rollout_node.sandbox.limits import PidsCgroup

    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer exists: the "node" that made the group
    stale = PidsCgroup.ROOT / f"spoolrl-sbx-{dead.pid}-orphan"
    stale.mkdir()
    orphan = subprocess.Popen(["/bin/sh", "-c", 'echo 0 > "$0/tasks" && exec sleep 300', str(stale)])
    group = None
    try:
        deadline = time.monotonic() + 10
        while str(orphan.pid) not in (stale / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.01)
        group = PidsCgroup(f"sbx-{os.getpid()}-sweeper", 64)  # a new sandbox sweeps
        assert orphan.wait(timeout=10) == -signal.SIGKILL
        group.remove()
        group = PidsCgroup(f"sbx-{os.getpid()}-sweeper", 64)  # the orphan is reaped: the group goes
        assert not stale.exists()
    finally:
        orphan.kill()
        orphan.wait()
        if group is not None:
            group.remove()
        if stale.exists():
            stale.rmdir()
