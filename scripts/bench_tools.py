#!/usr/bin/env python3
"""bench_tools.py: the agent tools' latency, side by side in one run.

Sections (each prints its figures; ratios are measured in the same run):
  bash     bash action latency through the real path (Sandbox.run, PTY + nonce marker, in bwrap)
           against a tmux driver (send-keys + capture-pane) polling every 10 ms and every 500 ms,
           with bash in the same bwrap sandbox; median, p95, ratios.
  holder   who holds the PTY: the node (the real path) or a helper process inside the sandbox
           (stdlib python owning the PTY, talking to the node over a Unix socket): cold start and
           per-action latency.
  cold     cold start per runtime: open_sandbox() until the first bash result (bwrap, apptainer,
           local), plus bare `bwrap true` for reference.
  init     INIT time for an image of >= --image-gb GB (a tarball: the test image + filler):
           staging into the node cache cold (extraction) and warm (cache hit), then first result.
  ipc      the python tool's round trip over a Unix socket against TCP loopback (same server,
           same framing), plus the full python-tool call in bwrap.
Usage: bench_tools.py [--only bash,holder,cold,init,ipc] [--n 60] [--image-gb 1.0]
Default run < 2 min on an idle 2-core machine. Needs the test image (scripts/build_image.sh),
tmux, and for apptainer scripts/install_apptainer.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc.config.sandbox import SandboxConfig
from rollout_node.sandbox import default_image, open_sandbox
from rollout_node.sandbox.images import ImageCache
from rollout_node.sandbox.pytool import SERVER_SOURCE
from rollout_node.sandbox.runtimes import BwrapRuntime, LaunchSpec, find_apptainer

CMDS = ["echo hi", "ls", "python3 -c 1"]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, round(p / 100 * (len(xs) - 1))))]


def summary(label: str, ms: list[float]) -> tuple[float, float]:
    med, p95 = statistics.median(ms), pct(ms, 95)
    print(f"  {label:42s} n={len(ms):4d} median={med:8.2f} ms  p95={p95:8.2f} ms")
    return med, p95


def per_command(lat: dict[str, list[float]]) -> None:
    for cmd, ms in lat.items():
        print(f"      {cmd:14s} median={statistics.median(ms):8.2f} ms  p95={pct(ms, 95):8.2f} ms")


# ------------------------------------------------------------------ bash: real path vs tmux
class TmuxDriver:
    """bash in the same bwrap sandbox, driven by send-keys and polled with capture-pane."""

    def __init__(self, work: Path, poll_s: float) -> None:
        self.sock, self.name, self.poll_s, self.i = f"spoolrl-bench-{os.getpid()}-{poll_s}", "bench", poll_s, 0
        wrapped = shlex.join([*bwrap_prefix(work), "--", "bash", "--norc", "--noprofile"])
        self.tmux("new-session", "-d", "-s", self.name, "-x", "200", "-y", "50", wrapped)
        time.sleep(0.3)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.sock, *args], check=True, capture_output=True, text=True).stdout

    def run(self, cmd: str) -> None:
        self.i += 1
        key = f"__D{self.i:05d}_"
        self.tmux("send-keys", "-t", self.name, f"{cmd}; printf '__D%s_%s__\\n' {self.i:05d} $?", "Enter")
        while key not in self.tmux("capture-pane", "-p", "-t", self.name, "-S", "-50"):
            time.sleep(self.poll_s)
        if self.i % 20 == 0:
            self.tmux("send-keys", "-t", self.name, "clear", "Enter")
            self.tmux("clear-history", "-t", self.name)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True)


def bash_real(n: int, work: Path) -> dict[str, list[float]]:
    lat: dict[str, list[float]] = {c: [] for c in CMDS}
    with open_sandbox(SandboxConfig(), work) as sb:
        for i in range(n):
            cmd = CMDS[i % len(CMDS)]
            t0 = time.perf_counter()
            r = sb.run(cmd)
            lat[cmd].append((time.perf_counter() - t0) * 1000)
            assert r.exit_code == 0, r
    return lat


def bwrap_prefix(work: Path) -> list[str]:
    spec = LaunchSpec(workdir=work, image=Path(default_image()), scratch=work)
    return BwrapRuntime().argv(spec, [])[:-1]  # drop the trailing "--" target


def alternate(n: int, work: Path, poll_s: float) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """The real path and a tmux driver, one command each in turn: drift in load hits both alike."""
    real: dict[str, list[float]] = {c: [] for c in CMDS}
    tmux: dict[str, list[float]] = {c: [] for c in CMDS}
    driver = TmuxDriver(work, poll_s)
    try:
        with open_sandbox(SandboxConfig(), work) as sb:
            for i in range(n):
                cmd = CMDS[i % len(CMDS)]
                t0 = time.perf_counter()
                assert sb.run(cmd).exit_code == 0
                real[cmd].append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                driver.run(cmd)
                tmux[cmd].append((time.perf_counter() - t0) * 1000)
    finally:
        driver.close()
    return real, tmux


def section_bash(args: argparse.Namespace, work: Path, out: dict[str, Any]) -> None:
    print("bash action latency (bwrap; commands round-robin: " + ", ".join(CMDS) + "; real and tmux alternate)")
    if not shutil.which("tmux"):
        summary("real path (node PTY + nonce marker)", sum(bash_real(args.n, work).values(), []))
        print("  tmux not installed: skipping the tmux driver")
        return
    for poll_s, n in ((0.01, args.n), (0.5, max(9, args.n // 6))):
        real, tmux = alternate(n, work, poll_s)
        med, p95 = summary("real path (node PTY + nonce marker)", sum(real.values(), []))
        per_command(real)
        tm, tp = summary(f"tmux send-keys/capture-pane, poll {poll_s * 1000:.0f} ms", sum(tmux.values(), []))
        per_command(tmux)
        print(f"      ratio tmux/real: median {tm / med:.1f}x, p95 {tp / p95:.1f}x")
        out[f"bash_tmux_{int(poll_s * 1000)}ms"] = {"median": tm, "p95": tp, "real_median": med, "ratio_median": tm / med}


# ------------------------------------------------------------------ holder: PTY in node vs in sandbox
HOLDER = r'''
import os, pty, re, select, socket, struct, sys
nonce = sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    os.environ["PROMPT_COMMAND"] = 'printf "\\036%s:%%s\\036" $?; PS1=; PS2=' % nonce
    os.execvp("bash", ["bash", "--norc", "--noprofile", "--noediting", "-i"])
import termios
a = termios.tcgetattr(fd); a[3] &= ~termios.ECHO; a[1] &= ~termios.ONLCR; termios.tcsetattr(fd, termios.TCSANOW, a)
marker = re.compile(b"\x1e" + nonce.encode() + rb":(\d+)\x1e")
def until_marker():
    buf = b""
    while True:
        m = marker.search(buf)
        if m:
            return buf[:m.start()], int(m.group(1))
        buf += os.read(fd, 65536)
until_marker()
srv = socket.socket(socket.AF_UNIX); srv.bind(sys.argv[1]); srv.listen(1)
conn, _ = srv.accept()
while True:
    h = conn.recv(4)
    if len(h) < 4:
        break
    n = struct.unpack(">I", h)[0]; cmd = b""
    while len(cmd) < n:
        cmd += conn.recv(n - len(cmd))
    os.write(fd, b"{ " + cmd + b"\n}\n")
    out, st = until_marker()
    conn.sendall(struct.pack(">Ii", len(out), st) + out)
'''


def holder_session(work: Path, n: int) -> tuple[float, list[float]]:
    sock = work / "h.sock"
    sock.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen([*bwrap_prefix(work), "--", "python3", "-c", HOLDER, "/work/h.sock", "n0nce"],
                            stdin=subprocess.DEVNULL, start_new_session=True)
    c = socket.socket(socket.AF_UNIX)
    while True:
        try:
            c.connect(str(sock))
            break
        except OSError:
            time.sleep(0.0005)

    def run(cmd: str) -> bytes:
        c.sendall(struct.pack(">I", len(cmd)) + cmd.encode())
        size, _status = struct.unpack(">Ii", _recv(c, 8))
        return _recv(c, size)
    run("true")
    cold = (time.perf_counter() - t0) * 1000
    lat = []
    for i in range(n):
        t = time.perf_counter()
        run(CMDS[i % len(CMDS)])
        lat.append((time.perf_counter() - t) * 1000)
    proc.kill()
    proc.wait()
    return cold, lat


def _recv(c: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = c.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def section_holder(args: argparse.Namespace, work: Path, out: dict[str, Any]) -> None:
    print("who holds the PTY (bwrap): the node vs a python helper inside the sandbox")
    colds_node, colds_in, lat_in = [], [], []
    for _ in range(5):
        colds_node.append(cold_start("bwrap", work))
        cold, lat = holder_session(work, args.n // 5)
        colds_in.append(cold)
        lat_in += lat
    real = sum(bash_real(args.n, work).values(), [])
    a, _ = summary("node holds PTY: cold start", colds_node)
    b, _ = summary("helper in sandbox holds PTY: cold start", colds_in)
    c, _ = summary("node holds PTY: action", real)
    d, _ = summary("helper in sandbox holds PTY: action", lat_in)
    print(f"      helper/node: cold start {b / a:.2f}x, action {d / c:.2f}x")
    out["holder"] = {"cold_node": a, "cold_helper": b, "action_node": c, "action_helper": d}


# ------------------------------------------------------------------ cold start
def cold_start(runtime: str, work: Path, image: str | None = None) -> float:
    cfg = SandboxConfig(runtime=runtime, allow_local=runtime == "local")  # type: ignore[arg-type]
    t0 = time.perf_counter()
    with open_sandbox(cfg, work, image=image) as sb:
        sb.run("true")
        return (time.perf_counter() - t0) * 1000


def section_cold(args: argparse.Namespace, work: Path, out: dict[str, Any]) -> None:
    print("cold start: open_sandbox() until the first bash result")
    bare = []
    for _ in range(args.cold_n):
        t0 = time.perf_counter()
        subprocess.run(["bwrap", "--ro-bind", default_image(), "/", "--unshare-all", "--", "/bin/true"], check=True)
        bare.append((time.perf_counter() - t0) * 1000)
    summary("reference: bare `bwrap --unshare-all true`", bare)
    binary = find_apptainer()
    if binary:
        bare = []
        for _ in range(args.cold_n):
            t0 = time.perf_counter()
            subprocess.run([binary, "--silent", "exec", "--containall", "--net", "--network", "none",
                            *(["--userns"] if os.geteuid() == 0 else []), default_image(), "/bin/true"], check=True)
            bare.append((time.perf_counter() - t0) * 1000)
        summary("reference: bare `apptainer exec --containall DIR true`", bare)
    runtimes = ["bwrap", "local"] + (["apptainer"] if binary else [])
    for rt in runtimes:
        cold_start(rt, work)  # warm the page cache
        ms = [cold_start(rt, work) for _ in range(args.cold_n)]
        med, p95 = summary(f"{rt}: sandbox + bash + first result", ms)
        out[f"cold_{rt}_ms"] = {"median": med, "p95": p95}


# ------------------------------------------------------------------ INIT with a big image
def big_image(path: Path, gb: float) -> Path:
    if path.exists():
        return path
    filler = Path(tempfile.mkdtemp(dir=path.parent))
    block = os.urandom(1 << 20)
    with open(filler / "blob", "wb") as f:
        for _ in range(int(gb * 1024) - 250):  # MiB; the rootfs itself is ~290 MB
            f.write(block)
    tmp = path.with_suffix(".part")
    with tarfile.open(tmp, "w") as tar:
        tar.add(default_image(), arcname=".", filter=lambda ti: None if ti.name.startswith("./dev/") else ti)
        tar.add(filler / "blob", arcname="./opt/filler.bin")
    shutil.rmtree(filler)
    tmp.rename(path)
    return path


def section_init(args: argparse.Namespace, work: Path, out: dict[str, Any]) -> None:
    base = Path(args.scratch)
    tar = big_image(base / f"bench-image-{args.image_gb:g}gib.tar", args.image_gb)  # kept for reruns
    size = tar.stat().st_size
    print(f"INIT with a {size / 1e9:.2f} GB ({size / 2**30:.2f} GiB) image tarball -> node cache -> first bash result")
    cache_dir = base / "bench-cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    cfg = SandboxConfig(image_cache_dir=str(cache_dir), image_cache_gb=10.0)
    for label in ("cold node cache", "warm node cache", "warm node cache"):
        t0 = time.perf_counter()
        lease = ImageCache(cache_dir, 10 * 2**30).stage(str(tar))
        staged = (time.perf_counter() - t0) * 1000
        lease.release()
        t1 = time.perf_counter()
        with open_sandbox(cfg, work, image=str(tar)) as sb:
            sb.run("true")
        first = (time.perf_counter() - t1) * 1000
        print(f"  {label:18s} stage {staged:9.1f} ms   then open + first result {first:7.1f} ms")
        out.setdefault("init_ms", []).append({"cache": label, "stage": staged, "first_result": first})
    shutil.rmtree(cache_dir, ignore_errors=True)


# ------------------------------------------------------------------ python tool: UDS vs TCP
def rtt(kind: str, n: int, tmp: Path) -> list[float]:
    if kind == "uds":
        lst = socket.socket(socket.AF_UNIX)
        path = str(tmp / "b.sock")
        Path(path).unlink(missing_ok=True)
        lst.bind(path)
        target = path
    else:
        lst = socket.socket(socket.AF_INET)
        lst.bind(("127.0.0.1", 0))
        target = f"tcp:127.0.0.1:{lst.getsockname()[1]}"
    lst.listen(1)
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SOURCE, target, "tok", "65536"])
    conn, _ = lst.accept()
    if kind == "tcp":
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    frame = _recv(conn, struct.unpack(">I", _recv(conn, 4))[0])
    assert json.loads(frame)["token"] == "tok"
    body = json.dumps({"code": "x = 1", "timeout_s": 0}).encode()
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.sendall(struct.pack(">I", len(body)) + body)
        _recv(conn, struct.unpack(">I", _recv(conn, 4))[0])
        lat.append((time.perf_counter() - t0) * 1e6)
    conn.close()
    proc.wait(10)
    lst.close()
    return lat


def section_ipc(args: argparse.Namespace, work: Path, out: dict[str, Any]) -> None:
    print("python tool round trip (same server and framing; times in microseconds)")
    tmp = Path(tempfile.mkdtemp(dir=args.scratch))
    res: dict[str, list[float]] = {}
    for _round in range(2):  # alternate to spread drift in the machine's load over both
        for kind in ("uds", "tcp"):
            res.setdefault(kind, []).extend(rtt(kind, args.ipc_n // 2, tmp))
    for kind in ("uds", "tcp"):
        med, p95 = statistics.median(res[kind]), pct(res[kind], 95)
        print(f"  {kind.upper():4s} n={len(res[kind])} median={med:8.1f} us  p95={p95:8.1f} us")
        out[f"ipc_{kind}_us"] = {"median": med, "p95": p95}
    print(f"      TCP/UDS median: {out['ipc_tcp_us']['median'] / out['ipc_uds_us']['median']:.2f}x")
    with open_sandbox(SandboxConfig(), work) as sb:
        sb.python("1")
        ms = []
        for _ in range(100):
            t0 = time.perf_counter()
            sb.python("x = 1")
            ms.append((time.perf_counter() - t0) * 1000)
    med, p95 = summary("full python tool call in bwrap (UDS)", ms)
    out["python_tool_ms"] = {"median": med, "p95": p95}
    shutil.rmtree(tmp, ignore_errors=True)


SECTIONS: dict[str, Callable[[argparse.Namespace, Path, dict[str, Any]], None]] = {
    "bash": section_bash, "holder": section_holder, "cold": section_cold, "init": section_init, "ipc": section_ipc}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    ap.add_argument("--n", type=int, default=60, help="bash actions per driver")
    ap.add_argument("--cold-n", type=int, default=10, help="cold starts per runtime")
    ap.add_argument("--ipc-n", type=int, default=4000, help="python tool round trips per transport")
    ap.add_argument("--image-gb", type=float, default=1.0, help="size of the INIT benchmark image (GiB)")
    ap.add_argument("--scratch", default=os.environ.get("TMPDIR", "/tmp"), help="node-local scratch")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args()
    if not Path(default_image(), ".spoolrl-image").exists():
        print(f"test image {default_image()} missing: run scripts/build_image.sh", file=sys.stderr)
        return 2
    out: dict[str, Any] = {"load_avg_1m": os.getloadavg()[0]}
    work = Path(tempfile.mkdtemp(prefix="bench-tools-", dir=args.scratch))
    print(f"load average at start: {os.getloadavg()[0]:.1f} (2 cores)")
    try:
        for name in args.only.split(","):
            SECTIONS[name](args, work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
