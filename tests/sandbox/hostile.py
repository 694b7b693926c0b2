"""Hostile-input checks against one sandbox runtime, run as whoever starts this script.

Usage: python hostile.py RUNTIME [CHECK ...]  ->  one JSON line per check:
``{"check": name, "passed": bool, "detail": str}``. The tests run it as root and, through
``tests.unprivileged.CiUser``, as an unprivileged user, so both paths execute the very same code. Each check opens
a fresh sandbox on a fresh work dir, attacks from inside, and verifies from the host side that
the attack was contained, reported in the tool result, and left the host untouched.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from hpc.config.sandbox import SandboxConfig
from rollout_node.sandbox import open_sandbox
from rollout_node.sandbox.limits import descendants
from rollout_node.sandbox.sandbox import Sandbox

RUNTIME: Any = sys.argv[1] if len(sys.argv) > 1 else "bwrap"
ISOLATED = RUNTIME != "local"
CFG = SandboxConfig(runtime=cast(Any, RUNTIME), allow_local=not ISOLATED, mem_gb=1.0, max_procs=64,
                    command_timeout_s=20.0, max_output_kb=16)
CHECKS: dict[str, Callable[[], str]] = {}
# every check's work dirs in one directory, removed when the script exits (by TemporaryDirectory's finalizer)
SCRATCH = tempfile.TemporaryDirectory(prefix="hostile-", ignore_cleanup_errors=True)


def check(isolated_only: bool = False) -> Callable[[Callable[[], str]], Callable[[], str]]:
    def deco(fn: Callable[[], str]) -> Callable[[], str]:
        if ISOLATED or not isolated_only:
            CHECKS[fn.__name__.removeprefix("check_")] = fn
        return fn
    return deco


def sandbox() -> Sandbox:
    return open_sandbox(CFG, Path(tempfile.mkdtemp(prefix="work-", dir=SCRATCH.name)))


def processes_matching(needle: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if needle.encode() in f.read().replace(b"\0", b" "):
                        found.append(int(name))
            except OSError:
                pass
    return found


@check(isolated_only=True)
def check_network() -> str:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    hits: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                hits.append(server.accept())
            except OSError:
                pass
    threading.Thread(target=accept, daemon=True).start()
    with sandbox() as sb:
        r = sb.run(f"(echo x > /dev/tcp/127.0.0.1/{port}) 2>&1; echo loop=$?; "
                   "(echo x > /dev/tcp/1.1.1.1/80) 2>&1; echo ext=$?; "
                   "timeout 3 getent hosts deb.debian.org; echo dns=$?; tail -n +3 /proc/net/dev | cut -d: -f1", timeout_s=20)
        p = sb.python(f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 2)\n"
                      "    print('connected')\nexcept OSError as e:\n    print('refused', e)")
    stop.set()
    time.sleep(0.3)
    assert "loop=1" in r.output and "ext=1" in r.output and "dns=0" not in r.output, r.output
    ifaces = r.output.strip().splitlines()[-1:]
    assert [i.strip() for i in ifaces] == ["lo"], r.output
    assert "refused" in p.output, p.output
    assert not hits, f"the host's loopback server saw {len(hits)} connection(s)"
    return "host loopback, internet and DNS unreachable; only lo"


@check(isolated_only=True)
def check_write_outside() -> str:
    tag = secrets.token_hex(6)
    with sandbox() as sb:
        image = sb._image.path if sb._image else Path("/")
        r = sb.run(f"for f in /etc/pwn-{tag} /usr/pwn-{tag} /pwn-{tag} /work/../pwn2-{tag}; do "
                   "touch $f 2>/dev/null && echo WROTE $f; done; "
                   f"echo data > /tmp/pwn-{tag} && echo tmp-ok; echo work > /work/ok-{tag}")
        wrote_work = (sb.workdir / f"ok-{tag}").exists()
    if RUNTIME == "bwrap":  # read-only root; apptainer writes land in a throw-away overlay layer
        assert "WROTE" not in r.output, r.output
    assert "tmp-ok" in r.output and wrote_work, r.output
    leaked = [p for p in (image / f"etc/pwn-{tag}", image / f"usr/pwn-{tag}", image / f"pwn-{tag}",
                          Path(f"/tmp/pwn-{tag}"), Path(f"/etc/pwn-{tag}")) if p.exists()]
    assert not leaked, f"files appeared on the host: {leaked}"
    return "image untouched, /tmp private, only /work reaches the host"


@check(isolated_only=True)
def check_read_home() -> str:
    home = Path(os.path.expanduser("~"))
    secret = "secret-" + secrets.token_hex(8)
    target = home / f".spoolrl-hostile-{secrets.token_hex(4)}"
    target.write_text(secret)
    try:
        with sandbox() as sb:
            r = sb.run(f"cat {target} 2>&1; ls -la {home} 2>&1; cat /home/*/.spoolrl-hostile-* /root/.spoolrl-hostile-* "
                       "2>&1; grep -rs spoolrl-hostile / --include='.spoolrl-hostile*' 2>/dev/null | head -3", timeout_s=20)
            v = sb.view(str(target))
    finally:
        target.unlink()
    assert secret not in r.output and secret not in v.output, r.output
    assert v.exit_code == 1, v
    return f"{home} invisible from inside"


@check()
def check_env_secret() -> str:
    secret = "hf_" + secrets.token_hex(12)
    os.environ["HF_TOKEN"] = secret
    try:
        with sandbox() as sb:
            r = sb.run("env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -i token")
            p = sb.python("import os; print(os.environ.get('HF_TOKEN'))")
            e = sb.exec(["env"], timeout_s=20)
    finally:
        del os.environ["HF_TOKEN"]
    for out in (r.output, p.output, e.output):
        assert secret not in out, out
    assert "None" in p.output, p.output
    return "HF_TOKEN not in shell, python or exec environments"


@check(isolated_only=True)
def check_fork_bomb() -> str:
    with sandbox() as sb:
        capped = ""
        if sb.cgroup.path is not None:  # root: the kernel-enforced cap must hold every sandbox process
            sb.run("sleep 60 >/dev/null &")
            assert sb.shell.pid is not None
            tree = {sb.shell.pid, *descendants([sb.shell.pid])}
            inside = {int(p) for p in (sb.cgroup.path / "cgroup.procs").read_text().split()}
            assert tree <= inside, f"sandbox processes outside its pids cgroup: {sorted(tree - inside)}"
            capped = f"; all {len(tree)} processes in its pids cgroup (max {(sb.cgroup.path / 'pids.max').read_text().strip()})"
        r = sb.run(":(){ :|:& };:; sleep 30", timeout_s=15)
        if "watchdog" not in r.output:
            # `sleep` itself may fail to fork under the process cap and the command return first;
            # the bomb keeps running in the background until the watchdog's next scan
            r = sb.run("sleep 20", timeout_s=30)
        after = sb.run("echo alive")
        pid = sb.shell.pid
    assert after.output == "alive\n", after
    assert "watchdog" in r.output and "processes" in r.output and not r.timed_out, r
    assert "a new shell was started" in r.output, r  # the restart after a bomb works (its pids released)
    assert pid is None or not processes_matching(":|:"), "fork bomb processes survived close()"
    return f"killed by the watchdog after {r.duration_s:.2f} s, shell usable again{capped}"


@check()
def check_memory_hog() -> str:
    with sandbox() as sb:
        one = sb.run("python3 -c 'b = bytearray(3 << 30)' 2>&1 | tail -1")
        many = sb.run("for i in 1 2 3 4; do python3 -c 'import time; b = b\"x\" * (400 << 20); time.sleep(60)' & done; wait",
                      timeout_s=30)
        after = sb.run("echo alive")
    assert "MemoryError" in one.output, one
    assert "watchdog" in many.output and "memory" in many.output, many
    assert after.output == "alive\n", after
    assert not processes_matching("time.sleep(60)"), "memory hogs survived"
    return "RLIMIT_AS stops one big allocation; the watchdog kills a tree over the memory sum"


@check()
def check_endless_output() -> str:
    with sandbox() as sb:
        r = sb.run("yes spoolrl", timeout_s=3)
        after = sb.run("echo alive")
    keep = CFG.max_output_kb * 1024
    assert r.timed_out and r.truncated and r.total_bytes > 4 * keep, r.to_dict() | {"output": len(r.output)}
    assert len(r.output) < 2 * keep + 200, len(r.output)
    assert after.output == "alive\n", after
    return f"{r.total_bytes} bytes counted, {len(r.output)} kept"


@check()
def check_sleep_forever() -> str:
    with sandbox() as sb:
        a = sb.run("sleep infinity", timeout_s=1)
        b = sb.run("echo alive")
        c = sb.run("trap '' INT; sleep infinity", timeout_s=1)
        d = sb.run("echo alive")
        p = sb.python("import time\nwhile True:\n    time.sleep(1)", timeout_s=1)
        q = sb.python("print('py alive')")
    assert a.timed_out and a.exit_code == 130 and b.output == "alive\n", (a, b)
    assert c.timed_out and c.exit_code is None and d.output == "alive\n", (c, d)
    assert p.timed_out and q.output == "py alive\n", (p, q)
    return "Ctrl-C, then kill+respawn for a job ignoring SIGINT; python interrupted"


@check()
def check_kill_tool_server() -> str:
    with sandbox() as sb:
        sb.python("x = 41")
        a = sb.python("import os; os.kill(os.getpid(), 9)")
        b = sb.python("print('back')")
        sb.python("y = 1")
        sb.run("pkill -9 -f pyserver; pkill -9 python3; true")
        c = sb.python("print('again')")
        d = sb.python("print('ok')")
    assert a.exit_code is None and "died" in a.output, a
    assert b.output.startswith("back"), b
    assert ("died" in c.output or "again" in c.output) and d.output.startswith("ok"), (c, d)
    return "a killed interpreter is reported and restarted"


@check()
def check_background_left_behind() -> str:
    tag = str(4000 + secrets.randbelow(999))
    with sandbox() as sb:
        sb.run(f"setsid nohup sleep {tag}1 >/dev/null 2>&1 & (sleep {tag}2 &); nohup sleep {tag}3 >/dev/null 2>&1 & disown -a")
        sb.python(f"import subprocess; subprocess.Popen(['sleep', '{tag}4'], start_new_session=True)")
        sb.exec(["bash", "-c", f"setsid sleep {tag}5 >/dev/null 2>&1 < /dev/null & echo started"], timeout_s=20)
        time.sleep(0.3)
        before = processes_matching(f"sleep {tag}")
    time.sleep(0.2)
    left = processes_matching(f"sleep {tag}")
    assert len(before) >= 4, f"expected the daemons to run before close(), saw {before}"
    assert not left, f"processes left behind after close(): {left}"
    return f"{len(before)} daemons (setsid/nohup/disown/subprocess) all gone after close()"


@check()
def check_file_tool_symlinks() -> str:
    secret_dir = Path(tempfile.mkdtemp(prefix="secret-", dir=SCRATCH.name))
    (secret_dir / "key").write_text("TOPSECRET")
    with sandbox() as sb:
        # relative paths: with the local runtime /work is the host's /work, not the work dir
        sb.run(f"cd {sb.inside} && ln -s {secret_dir}/key abs && ln -s ../../../../..{secret_dir}/key rel && "
               f"ln -s {secret_dir} dir && mkfifo fifo")
        views = [sb.view("abs"), sb.view(f"{sb.inside}/rel"), sb.view("dir/key"), sb.view("fifo")]
        writes = [sb.create("dir/new", "x"), sb.str_replace("abs", "TOPSECRET", "changed"),
                  sb.insert("rel", 0, "x"), sb.create("/etc/evil", "x")]
    for r in views + writes:
        assert r.exit_code == 1 and "TOPSECRET" not in r.output, r
    assert (secret_dir / "key").read_text() == "TOPSECRET" and not (secret_dir / "new").exists()
    return "symlinks out of /work, FIFOs and paths outside /work refused by the node-side file tools"


def main() -> None:
    wanted = sys.argv[2:] or list(CHECKS)
    for name in wanted:
        t0 = time.monotonic()
        try:
            detail, passed = CHECKS[name](), True
        except Exception:  # noqa: BLE001 - every failure is reported, the next check still runs
            detail, passed = traceback.format_exc()[-3000:], False
        print(json.dumps({"check": name, "passed": passed, "detail": detail,
                          "seconds": round(time.monotonic() - t0, 2)}), flush=True)


if __name__ == "__main__":
    main()
