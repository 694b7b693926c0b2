"""Chaos driver (run as its own process by test_chaos.py): kill the trainer again and again, then audit.

The driver imports torch/transformers/DeepSpeed once and forks one trainer child per episode, so
a restart costs an engine init instead of a Python start (the parent never computes, so forking
after importing torch is safe). Episodes:

- ``random``: SIGKILL from outside after a random delay (anywhere: setup, step, checkpoint, publish);
- ``fault:<point>``: ``SPOOLRL_FAULT=<point>:<n>`` makes the child SIGKILL itself at a named point.

Then one clean run drains the spool (STOP marker) and the lineage's ledgers are audited against
the known set of produced trajectories. Prints one JSON line ``RESULT {...}``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: imports are by package path

from hpc.trajectory import Status, Trajectory  # noqa: E402
from tests.trainer.helpers import free_port, make_group, make_run, run_config, write_groups  # noqa: E402

POINTS = ("step", "checkpoint", "after_checkpoint", "publish")


def make_groups(n_groups: int, seed: int) -> list[tuple[str, list[Trajectory]]]:
    """A known mixture, in production order: normal, zero-variance, infrastructure failures, stale
    samples, and late duplicates of earlier tasks from another worker (the spool drops one copy)."""
    rng = np.random.default_rng(seed)
    out: list[tuple[str, list[Trajectory]]] = []
    for i in range(n_groups):
        task = f"task{i:03d}@e0"
        rewards = [1.0, 0.0] + [float(x) for x in rng.integers(0, 2, 2)]
        if i % 7 == 3:
            rewards = [1.0] * 4
        g = make_group(task, rewards, rng, version=0 if i % 11 == 5 else 10_000, gen_len=8)
        if i % 5 == 2:  # an infrastructure failure inside the group: excluded, never scored 0
            g[3] = dataclasses.replace(g[3], status=Status.SANDBOX_ERROR, reward=None)
        out.append(("producer", g))
        if i % 9 == 4:
            late = make_group(f"task{i - 4:03d}@e0", [1.0, 0.0, 1.0, 0.0], rng, group=f"task{i - 4:03d}@e0#late")
            out.append(("late-worker", [dataclasses.replace(t, trajectory_id=t.trajectory_id + "#late") for t in late]))
    return out


def produce(root: Path, chunk: list[tuple[str, list[Trajectory]]]) -> None:
    for worker, g in chunk:
        write_groups(root, [g], worker=worker)


def child(root: Path, fault: str, max_idle_s: float) -> None:
    os.environ["SPOOLRL_FAULT"] = fault
    from hpc.rundir import open_run
    from train_node.trainer.dist_env import DistEnv
    from train_node.trainer.loop import Options, Trainer

    _, cfg = open_run(root)
    dist = DistEnv(0, 0, 1, "127.0.0.1", free_port(), "single")
    t = Trainer(root, cfg, Options(max_idle_s=max_idle_s), dist=dist)
    t.setup()
    os._exit(t.run())


def episode(root: Path, fault: str, kill_after: float | None, max_idle_s: float = 5.0) -> dict[str, object]:
    pid = os.fork()
    if pid == 0:
        try:
            child(root, fault, max_idle_s)
        finally:
            os._exit(3)
    t0 = time.monotonic()
    killed = False
    done, status = 0, 0
    if kill_after is not None:
        while time.monotonic() - t0 < kill_after:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:  # ended by itself (e.g. no data left) before the kill
                break
            time.sleep(0.02)
        else:
            os.kill(pid, signal.SIGKILL)
            killed = True
    if not done:
        _, status = os.waitpid(pid, 0)
    return {"fault": fault, "killed": killed, "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0,
            "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None, "s": round(time.monotonic() - t0, 2)}


def audit(root: Path, produced: list[str]) -> dict[str, object]:
    from train_node.trainer import checkpoint as ckpt

    paths = ckpt.RunPaths(root)
    ledger = [e for m in ckpt.lineage(paths) for e in ckpt.read_ledger(paths, m["tag"])]
    seen: dict[str, int] = {}
    for e in ledger:
        seen[e["trajectory_id"]] = seen.get(e["trajectory_id"], 0) + 1
    steps_of_task: dict[str, set[int]] = {}
    for e in ledger:
        if e["outcome"] == "trained":
            steps_of_task.setdefault(e["task_id"], set()).add(e["step"])
    reasons: dict[str, int] = {}
    for e in ledger:
        key = e["outcome"] if e["outcome"] == "trained" else f"dropped:{e['reason']}"
        reasons[key] = reasons.get(key, 0) + 1
    return {
        "produced": len(produced), "ledger": len(ledger),
        "missing": sorted(set(produced) - set(seen))[:10], "extra": sorted(set(seen) - set(produced))[:10],
        "twice": sorted(k for k, v in seen.items() if v > 1)[:10],
        "tasks_trained": len(steps_of_task),
        "tasks_trained_twice": sorted(k for k, v in steps_of_task.items() if len(v) > 1),
        "outcomes": reasons,
        "spool_ready": len(list((root / "spool" / "shards" / "ready").glob("*.shard"))),
        "spool_claimed": sum(1 for _ in (root / "spool" / "shards" / "claimed").glob("*/*.shard")),
    }


def main() -> None:
    root = Path(sys.argv[1])
    n_random, per_point, seed = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    import deepspeed  # noqa: F401
    import torch  # noqa: F401  (imported once here; the children inherit it)

    import train_node.trainer.loop  # noqa: F401

    cfg = run_config(trainer={"checkpoint_every": 2, "micro_batch_tokens": 128, "keep_checkpoints": 2},
                     algorithm={"groups_per_step": 2, "max_staleness": 3})
    make_run(root, cfg)
    rng = random.Random(seed)
    plan: list[tuple[str, float | None]] = [("", rng.uniform(0.3, 5.0)) for _ in range(n_random)]
    plan += [(f"{p}:1", None) for p in POINTS for _ in range(per_point)]
    rng.shuffle(plan)
    # a fault episode gets enough fresh data to reach its fault point (2 steps and a checkpoint)
    sizes = [8 if fault else 3 for fault, _ in plan]
    groups = make_groups(sum(sizes), seed)
    produced = [t.trajectory_id for _, g in groups for t in g]
    episodes, start = [], 0
    for (fault, after), size in zip(plan, sizes, strict=True):
        produce(root, groups[start:start + size])  # the producer keeps writing while trainers die
        start += size
        # a random-kill episode waits for data until it is killed; a fault episode gives up when idle
        episodes.append(episode(root, fault, after, max_idle_s=3.0 if fault else 60.0))
    produce(root, groups[start:])  # the rest (late duplicates make the list longer than the sizes)
    (root / "control").mkdir(exist_ok=True)
    (root / "control" / "STOP").write_text("drain\n")
    final = episode(root, "", None, max_idle_s=30.0)
    print("RESULT " + json.dumps({"episodes": episodes, "final": final, "audit": audit(root, produced)}), flush=True)


if __name__ == "__main__":
    main()
