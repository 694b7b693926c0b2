#!/usr/bin/env python3
"""Spool benchmark: throughput against a raw write, metadata syscalls, publish-to-visible latency.

Measured side by side in one run, on the same disk (``--dir``, default: a temporary directory
under the current directory so it lands on the disk a run directory would use):

1. Throughput: N writer processes and M reader processes move 4,096-token trajectories through
   the spool (writers seal shards, readers claim, decode every trajectory, commit), against N
   processes writing the same number of bytes per shard with one fsync per shard (raw). Each
   process builds its input first; the clock and the CPU count start at a shared start line.
   Runs alternate raw/spool ``--reps`` times; the medians are compared.
2. Metadata system calls, counted with ``strace -f``: per trajectory through the whole pipeline
   (creates, renames, unlinks, links, mkdirs = metadata-changing; plus opens, stats, getdents),
   and per idle consumer per second (``wait_for_shards`` on an empty spool).
3. Publish-to-visible latency at the default poll interval: a writer process publishes shards at
   random moments; a consumer process polls with ``wait_for_shards``; p50/p95 of the delay.

Targets (issue 2): spool >= 50 % of raw MB/s; <= 0.1 metadata-changing ops per trajectory;
<= 2 metadata calls per idle consumer per second; visibility p50 <= 1.5 x poll interval.
Default run: about 1-2 minutes. ``--trajectories``, ``--writers``, ``--readers``, ``--reps``,
``--latency-samples`` make it bigger.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hpc.config.spool import SpoolConfig
from hpc.spool import Spool
from hpc.trajectory import Trajectory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "spool"))
from spool_helpers import wait_for_shards  # noqa: E402  (a test-only spool call: polling for shards)

CTX = multiprocessing.get_context("fork")
TOKENS = 4096
GROUP = 8
MARK_START, MARK_END = "/spoolrl-bench-phase-start", "/spoolrl-bench-phase-end"
CHANGING = ("rename", "renameat", "renameat2", "unlink", "unlinkat", "link", "linkat", "mkdir", "mkdirat",
            "rmdir", "symlink", "symlinkat", "creat")
LOOKUPS = ("open", "openat", "stat", "lstat", "newfstatat", "statx", "access", "faccessat", "faccessat2",
           "getdents", "getdents64", "readlink", "readlinkat")


def make_group(task: str, rng: np.random.Generator) -> list[Trajectory]:
    prompt = 512
    mask = np.zeros(TOKENS, np.int8)
    mask[prompt:] = 1
    out = []
    for i in range(GROUP):
        logp = np.where(mask == 1, -rng.random(TOKENS, dtype=np.float32), 0).astype(np.float32)
        out.append(Trajectory(
            trajectory_id=f"{task}/{i}", task_id=task, group_id=task, sample_index=i,
            token_ids=rng.integers(0, 150_000, TOKENS, dtype=np.int32), loss_mask=mask, logprobs=logp,
            policy_versions=np.where(mask == 1, 7, -1).astype(np.int32), reward=float(i % 2),
        ))
    return out


# ------------------------------------------------------------------------------------ workers


def build_groups(wid: str, groups: int) -> list[list[Trajectory]]:
    """Built before timing starts: generating tokens is the rollout's cost, not the spool's."""
    rng = np.random.default_rng(abs(hash(wid)) % 2**32)
    return [make_group(f"{wid}-{g}", rng) for g in range(groups)]


class Start:
    """A start line for one pass: each process prepares (builds its input, opens the spool) before
    the barrier, the parent times from the barrier to the last exit, and each process reports the
    CPU it used after the barrier. Forking a parent that holds the data would time page-table
    copies and copy-on-write faults of the benchmark instead of the spool."""

    def __init__(self, processes: int) -> None:
        self.barrier = CTX.Barrier(processes + 1)
        self.cpu = CTX.Value("d", 0.0)

    def go(self) -> float:
        self.barrier.wait()
        return time.process_time()

    def done(self, cpu0: float) -> None:
        with self.cpu.get_lock():
            self.cpu.value += time.process_time() - cpu0


def spool_writer(run: str, wid: str, groups: int, config: SpoolConfig, start: Start) -> None:
    data = build_groups(wid, groups)
    with Spool(run, config).writer(wid) as writer:
        cpu0 = start.go()
        for group in data:
            writer.add_group(group)
    start.done(cpu0)


def spool_reader(run: str, rid: str, total: int, config: SpoolConfig, counter: Any, start: Start) -> None:
    spool = Spool(run, config)
    cpu0 = start.go()
    while True:
        with counter.get_lock():
            if counter.value >= total:
                break
        shards = spool.claim_shards(rid, 4)
        if not shards:
            time.sleep(0.02)  # a busy reader: throughput, not idle cost, is measured here
            continue
        n = sum(len(s) for s in shards)  # claimed, verified (XXH3), decoded (Arrow), deduplicated
        spool.commit(rid, [s.shard_id for s in shards])
        with counter.get_lock():
            counter.value += n
    start.done(cpu0)


def raw_writer(path: str, shards: int, shard_bytes: int, start: Start) -> None:
    chunk = os.urandom(min(shard_bytes, 1 << 20))
    with open(path, "wb") as f:
        cpu0 = start.go()
        for _ in range(shards):
            left = shard_bytes
            while left > 0:
                left -= f.write(chunk[: min(left, len(chunk))])
            f.flush()
            os.fsync(f.fileno())
    start.done(cpu0)


def _run_all(procs: list[Any], start: Start | None = None) -> float:
    """Seconds from the start line (or from the first start) until every process has ended."""
    for p in procs:
        p.start()
    if start is not None:
        start.barrier.wait()
    t0 = time.perf_counter()
    for p in procs:
        p.join()
        assert p.exitcode == 0, f"a benchmark process failed (exit {p.exitcode})"
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------ phases


def setup_spool(base: Path, args: argparse.Namespace, config: SpoolConfig) -> tuple[Path, list[Any], Start]:
    """A fresh run dir and the (not yet started) writer and reader processes of one pass."""
    run = Path(tempfile.mkdtemp(dir=base, prefix="spool-"))
    Spool(run, config)
    groups = args.trajectories // GROUP // args.writers
    total = groups * GROUP * args.writers
    counter = CTX.Value("q", 0)
    start = Start(args.writers + args.readers)
    procs = [CTX.Process(target=spool_writer, args=(str(run), f"w{i}", groups, config, start))
             for i in range(args.writers)]
    procs += [CTX.Process(target=spool_reader, args=(str(run), f"r{i}", total, config, counter, start))
              for i in range(args.readers)]
    return run, procs, start


def phase_spool(base: Path, args: argparse.Namespace, config: SpoolConfig) -> tuple[float, float, int, int]:
    """(seconds, CPU seconds, bytes of shards, shards) for one pass of the whole pipeline."""
    run, procs, start = setup_spool(base, args, config)
    seconds = _run_all(procs, start)
    files = list((run / "spool" / "shards" / "committed").iterdir())
    size = sum(f.stat().st_size for f in files)
    shutil.rmtree(run)
    return seconds, start.cpu.value, size, len(files)


def phase_raw(base: Path, args: argparse.Namespace, shard_bytes: int, shards: int) -> tuple[float, float]:
    """(seconds, CPU seconds) to write ``shards`` x ``shard_bytes`` raw, scaled to exactly that many."""
    d = Path(tempfile.mkdtemp(dir=base, prefix="raw-"))
    per = shards // args.writers
    start = Start(args.writers)
    procs = [CTX.Process(target=raw_writer, args=(str(d / f"w{i}"), per, shard_bytes, start))
             for i in range(args.writers)]
    seconds = _run_all(procs, start)
    shutil.rmtree(d)
    scale = shards / (per * args.writers)
    return seconds * scale, start.cpu.value * scale


def throughput(base: Path, args: argparse.Namespace, config: SpoolConfig) -> dict[str, Any]:
    spool_rates, raw_rates, traj_rates, spool_cpu, raw_cpu = [], [], [], [], []
    for _ in range(args.reps):
        seconds, cpu, size, shards = phase_spool(base, args, config)
        trajs = args.trajectories // GROUP // args.writers * GROUP * args.writers
        spool_rates.append(size / seconds / 1e6)
        traj_rates.append(trajs / seconds)
        raw_s, raw_cpu_s = phase_raw(base, args, size // shards, shards)
        raw_rates.append(size / raw_s / 1e6)
        spool_cpu.append(cpu / (size / 1e6) * 1e3)
        raw_cpu.append(raw_cpu_s / (size / 1e6) * 1e3)
    spool_mb, raw_mb = statistics.median(spool_rates), statistics.median(raw_rates)
    return {"trajectories_per_s": statistics.median(traj_rates), "spool_mb_s": spool_mb, "raw_mb_s": raw_mb,
            "ratio": spool_mb / raw_mb, "spool_runs_mb_s": spool_rates, "raw_runs_mb_s": raw_rates,
            "spool_cpu_ms_per_mb": statistics.median(spool_cpu), "raw_cpu_ms_per_mb": statistics.median(raw_cpu),
            "trajectory_mb": TOKENS * 13 / 1e6}


def _marker(name: str) -> None:
    try:
        os.stat(name)
    except OSError:
        pass


def traced_pipeline(base: str, trajectories: int) -> None:
    """Inside strace: warm up, then one writer + one reader move ``trajectories`` between markers."""
    config = SpoolConfig()
    args = argparse.Namespace(trajectories=trajectories, writers=2, readers=1)
    warm = Path(tempfile.mkdtemp(dir=base))  # import and first-use costs stay outside the markers
    spool = Spool(warm)
    with spool.writer("warm") as writer:
        writer.add_group(make_group("warm", np.random.default_rng(0)))
    for shard in spool.claim_shards("warm", 1):
        list(shard.trajectories())
    shutil.rmtree(warm)
    _run, procs, start = setup_spool(Path(base), args, config)
    for p in procs:
        p.start()
    _marker(MARK_START)  # the processes build their input first, then meet at the start line
    start.barrier.wait()
    for p in procs:
        p.join()
    _marker(MARK_END)


def traced_idle(base: str, seconds: float) -> None:
    """Steady state: the first listing and the settle listing happen before the window opens."""
    from hpc.spool import SETTLE_S

    run = Path(tempfile.mkdtemp(dir=base))
    spool = Spool(run)
    wait_for_shards(spool, "idle", 4, timeout_s=SETTLE_S + 1.5)
    _marker(MARK_START)
    wait_for_shards(spool, "idle", 4, timeout_s=seconds)
    _marker(MARK_END)


def _joined_calls(lines: list[str]) -> list[str]:
    """strace -f splits a call interrupted by another process into '<unfinished ...>' and
    '<... NAME resumed>' lines; join them back into one line per call."""
    pending: dict[str, str] = {}
    out = []
    for line in lines:
        pid = line.split(" ", 1)[0]
        if line.endswith("<unfinished ...>"):
            pending[pid] = line[: -len("<unfinished ...>")]
            continue
        m = re.match(r"^(\d+)\s+<\.\.\. \w+ resumed>(.*)$", line)
        if m:
            out.append(pending.pop(pid, f"{pid} ?(") + m.group(2))
            continue
        out.append(line)
    return out


def strace_counts(base: Path, phase: str, value: float) -> tuple[dict[str, int], int]:
    """(syscall -> count between the markers, O_CREAT opens) for one traced phase."""
    log = base / f"strace-{phase}.log"
    cmd = ["strace", "-f", "-qq", "-o", str(log), "-e", "trace=%file,%desc,getdents64", sys.executable,
           __file__, "--traced", phase, "--dir", str(base), "--value", str(value)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    counts: dict[str, int] = {}
    creates, inside = 0, False
    for line in _joined_calls(log.read_text(errors="replace").splitlines()):
        if MARK_START in line:
            inside = True
            continue
        if MARK_END in line:
            break
        m = re.match(r"^\d+\s+(\w+)\(", line)
        if not inside or not m or "AT_EMPTY_PATH" in line:
            continue  # AT_EMPTY_PATH: fstat of an open descriptor, answered without a lookup
        name = m.group(1)
        if name in CHANGING and not re.search(r"\)\s+= 0$", line):
            name += "(failed)"  # e.g. mkdir of an existing dir: a lookup, nothing changed
        elif name not in CHANGING and name not in LOOKUPS:
            continue
        counts[name] = counts.get(name, 0) + 1
        creates += name in ("open", "openat") and "O_CREAT" in line and " = -1" not in line
    log.unlink()
    return counts, creates


def metadata(base: Path, args: argparse.Namespace) -> dict[str, Any]:
    if shutil.which("strace") is None:
        return {"skipped": "strace is not installed (apt-get install strace)"}
    counts, creates = strace_counts(base, "pipeline", args.strace_trajectories)
    changing = sum(v for k, v in counts.items() if k in CHANGING) + creates
    idle, _ = strace_counts(base, "idle", args.idle_seconds)
    return {"per_trajectory_changing": changing / args.strace_trajectories,
            "per_trajectory_all": sum(counts.values()) / args.strace_trajectories,
            "pipeline_counts": counts, "pipeline_creates": creates,
            "idle_per_s": sum(idle.values()) / args.idle_seconds, "idle_counts": idle}


# ------------------------------------------------------------------------------------ latency


def latency_writer(run: str, samples: int, seed: int) -> None:
    rng = random.Random(seed)
    group = make_group("lat", np.random.default_rng(seed))
    spool = Spool(run)
    with open(Path(run) / "published.jsonl", "a") as log:
        for i in range(samples):
            time.sleep(rng.uniform(0.5, 2.5))
            writer = spool.writer(f"lat{i}")
            writer.add_group(group[:1])
            shard_id = writer.flush()
            log.write(json.dumps({"shard": shard_id, "t": time.time()}) + "\n")
            log.flush()


def latency(base: Path, args: argparse.Namespace) -> dict[str, Any]:
    run = Path(tempfile.mkdtemp(dir=base, prefix="lat-"))
    spool = Spool(run)
    proc = CTX.Process(target=latency_writer, args=(str(run), args.latency_samples, 7))
    proc.start()
    seen: dict[str, float] = {}
    while len(seen) < args.latency_samples and (proc.is_alive() or spool.pending_work()):
        for shard in wait_for_shards(spool, "lat", 16, timeout_s=5):
            seen[shard.shard_id] = time.time()
    proc.join()
    published = [json.loads(x) for x in (run / "published.jsonl").read_text().splitlines()]
    delays = sorted(seen[p["shard"]] - p["t"] for p in published if p["shard"] in seen)
    shutil.rmtree(run)
    return {"samples": len(delays), "p50_s": float(np.percentile(delays, 50)),
            "p95_s": float(np.percentile(delays, 95)), "poll_interval_s": SpoolConfig().poll_interval_s}


def materialise_cost() -> dict[str, float]:
    """Per-trajectory cost of ``Shard.trajectories()`` (records from a decoded, checked shard)."""
    from hpc.shard import decode_table, encode_shard, table_trajectories

    rng = np.random.default_rng(1)
    header, body = encode_shard([t for i in range(16) for t in make_group(f"m{i}", rng)], "m")
    table = decode_table(header + body.to_pybytes(), "m")
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        n = sum(1 for _ in table_trajectories(table, "m"))
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return {"trajectory_us": best}


# ------------------------------------------------------------------------------------ report


def report(results: dict[str, Any]) -> bool:
    t, m, lat = results["throughput"], results["metadata"], results["latency"]
    poll = lat["poll_interval_s"]
    rows = [
        ("throughput ratio spool/raw", f"{t['ratio']:.2f}", ">= 0.50", t["ratio"] >= 0.5),
        ("metadata-changing ops per trajectory", f"{m.get('per_trajectory_changing', float('nan')):.4f}", "<= 0.1",
         m.get("per_trajectory_changing", 1) <= 0.1),
        ("metadata calls per idle consumer per s", f"{m.get('idle_per_s', float('nan')):.2f}", "<= 2",
         m.get("idle_per_s", 99) <= 2),
        ("visibility p50 (s)", f"{lat['p50_s']:.2f}", f"<= {1.5 * poll:.2f}", lat["p50_s"] <= 1.5 * poll),
    ]
    print(f"\nload average during the run: {results['load']} on {os.cpu_count()} cores (CPU-bound spool work "
          f"suffers from contention, the raw write barely does)")
    print(f"spool: {t['trajectories_per_s']:.1f} trajectories/s ({TOKENS}-token), {t['spool_mb_s']:.1f} MB/s; "
          f"raw write same bytes, fsync per shard: {t['raw_mb_s']:.1f} MB/s")
    print(f"CPU per MB moved (all processes, user+sys): spool {t['spool_cpu_ms_per_mb']:.2f} ms "
          f"(encode, XXH3 twice, decode + row check, dedup), raw {t['raw_cpu_ms_per_mb']:.2f} ms")
    print(f"metadata per trajectory (all path/dir calls): {m.get('per_trajectory_all', float('nan')):.3f}; "
          f"pipeline counts {m.get('pipeline_counts')} (+{m.get('pipeline_creates')} O_CREAT opens)")
    print(f"idle consumer counts over the window: {m.get('idle_counts')}")
    print(f"visibility p95 (s): {lat['p95_s']:.2f} over {lat['samples']} shards")
    print(f"materialising Trajectory records (trainer side; the rows were checked column-wise at decode): "
          f"{results['decode']['trajectory_us']:.0f} us per trajectory\n")
    ok = True
    for name, value, target, passed in rows:
        print(f"  {name:<42} {value:>8}   target {target:<8} {'PASS' if passed else 'FAIL'}")
        ok &= passed
    return ok


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=".", help="where to benchmark (the disk under test); default: here")
    p.add_argument("--writers", type=int, default=2)
    p.add_argument("--readers", type=int, default=1)
    p.add_argument("--trajectories", type=int, default=8192,
                   help="per throughput pass (8,192 x 53 kB: long enough that start-up costs do not dominate)")
    p.add_argument("--reps", type=int, default=3, help="alternating spool/raw passes (medians compared)")
    p.add_argument("--strace-trajectories", type=int, default=1024)
    p.add_argument("--idle-seconds", type=float, default=10.0)
    p.add_argument("--latency-samples", type=int, default=15)
    p.add_argument("--json", action="store_true", help="also print the results as one JSON object")
    p.add_argument("--traced", choices=("pipeline", "idle"), help=argparse.SUPPRESS)
    p.add_argument("--value", type=float, default=0, help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    if args.traced == "pipeline":
        traced_pipeline(args.dir, int(args.value))
        return 0
    if args.traced == "idle":
        traced_idle(args.dir, args.value)
        return 0
    base = Path(tempfile.mkdtemp(dir=args.dir, prefix=".bench-spool-"))
    try:
        config = SpoolConfig()
        print(f"bench_spool: {args.writers} writers, {args.readers} readers, {args.trajectories} x {TOKENS}-token "
              f"trajectories per pass, groups of {GROUP}, shards of {config.shard_max_trajectories}, in {base}")
        results = {"throughput": throughput(base, args, config), "metadata": metadata(base, args),
                   "latency": latency(base, args), "decode": materialise_cost(),
                   "load": " ".join(f"{x:.1f}" for x in os.getloadavg())}
        ok = report(results)
        if args.json:
            print(json.dumps(results, sort_keys=True))
        return 0 if ok else 1
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
