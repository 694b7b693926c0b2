#!/usr/bin/env python3
"""Trainer benchmark: idle fraction, tokens/s, packing efficiency, prefetch on vs off; publish and checkpoint times.

A synthetic producer (its own process) writes trajectory groups into the spool at a controlled rate
while the real trainer (1 rank, DeepSpeed on CPU, tiny Qwen2) trains. Each configuration runs on its
own fresh run directory, one after the other, so ratios are measured side by side in one invocation.

    .venv/bin/python scripts/bench_trainer.py                  # default: < 2 min
    .venv/bin/python scripts/bench_trainer.py --steps 200 --hidden 256 --layers 4 --gen-len 256
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402


def tiny_model(path: Path, hidden: int, layers: int, vocab: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(str(path))


def make_groups(n: int, args: argparse.Namespace, seed: int) -> list[Any]:
    from hpc.trajectory import Trajectory

    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        task = f"b{seed}-{k}@e0"
        group = []
        for i in range(args.group_size):
            length = args.prompt_len + int(rng.integers(args.gen_len // 4, args.gen_len + 1))
            mask = np.zeros(length, dtype=np.int8)
            mask[args.prompt_len:] = 1
            group.append(Trajectory(
                trajectory_id=f"{task}/{i}", task_id=task, group_id=task, sample_index=i,
                token_ids=rng.integers(3, args.vocab, length).astype(np.int32), loss_mask=mask,
                logprobs=np.where(mask == 1, -rng.uniform(4, 7, length), 0).astype(np.float32),
                policy_versions=np.where(mask == 1, 10**6, -1).astype(np.int32), reward=float(i % 2),
                logprob_kind="processed", sampling={"temperature": 1.0}))
        out.append(group)
    return out


def producer(run: str, rate: float, args: argparse.Namespace, stop_file: str) -> None:
    """Write groups at ``rate`` groups/s (0 = as fast as possible) until ``stop_file`` exists."""
    from hpc.spool import Spool

    spool = Spool(run)
    seed, t0, sent = 0, time.monotonic(), 0
    with spool.writer("bench-producer") as w:
        while not os.path.exists(stop_file):
            if spool.pending_work() >= 64:
                time.sleep(0.01)
                continue
            for g in make_groups(4, args, seed):
                w.add_group(g)
            w.flush()
            seed += 1
            sent += 4
            if rate > 0:
                time.sleep(max(0.0, t0 + sent / rate - time.monotonic()))


def run_one(name: str, prefetch: bool, rate: float, args: argparse.Namespace, base: Path, port: int) -> dict[str, Any]:
    from hpc.config import config_from_dict
    from hpc.metrics import read_metrics
    from hpc.rundir import create_run
    from train_node.trainer.dist_env import DistEnv
    from train_node.trainer.loop import Options, Trainer

    cfg = config_from_dict({
        "trainer": {"zero_stage": args.stage, "precision": "fp32", "total_steps": args.steps, "lr": 1e-4,
                    "micro_batch_tokens": args.micro_batch_tokens, "checkpoint_every": args.checkpoint_every,
                    "publish_every": 1, "prefetch": prefetch},
        "algorithm": {"group_size": args.group_size, "groups_per_step": args.groups_per_step, "max_staleness": 10**7},
        "spool": {"poll_interval_s": 0.05, "shard_max_age_s": 0.5},
        "slurm": {"train": {"gpus_per_node": 0}},
    })
    run = base / name
    create_run(run, cfg, prepare=lambda p, _c: tiny_model(p.model, args.hidden, args.layers, args.vocab))
    stop_file = str(run / "bench-stop")
    proc = mp.get_context("fork").Process(target=producer, args=(str(run), rate, args, stop_file), daemon=True)
    proc.start()
    try:
        trainer = Trainer(run, cfg, Options(idle_timeout_s=0.2), dist=DistEnv(0, 0, 1, "127.0.0.1", port, "single"))
        trainer.setup()
        t0 = time.perf_counter()
        trainer.run()
        wall = time.perf_counter() - t0
    finally:
        Path(stop_file).write_text("stop")
        proc.join(timeout=10)
    steps = list(read_metrics(run, "train_step"))
    ckpts = list(read_metrics(run, "checkpoint"))
    stop = list(read_metrics(run, "trainer_stop"))[-1]
    publishes = [s["publish_done"] for s in steps if s.get("publish_done")]
    return {
        "config": name, "prefetch": prefetch, "rate_groups_per_s": rate or "max", "steps": len(steps),
        "wall_s": round(wall, 2), "steps_per_s": round(len(steps) / wall, 2),
        "tokens_per_s": round(sum(s["tokens"] for s in steps) / wall, 1),
        "idle_fraction": round(stop["idle_fraction"], 4),
        "packing_efficiency": round(statistics.mean(s["packing_efficiency"] for s in steps), 3),
        "step_s_median": round(statistics.median(s["step_s"] for s in steps), 4),
        "publish_copy_s_median": round(statistics.median(p["copy_s"] for p in publishes), 4) if publishes else None,
        "publish_write_s_median": round(statistics.median(p["write_s"] for p in publishes), 4) if publishes else None,
        "checkpoint_s_median": round(statistics.median(c["seconds"] for c in ckpts), 3) if ckpts else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--gen-len", type=int, default=96)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups-per-step", type=int, default=4)
    ap.add_argument("--micro-batch-tokens", type=int, default=1024)
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--slow-rate", type=float, default=4.0, help="groups/s of the 'slow producer' configuration")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from hpc.cli.util import print_json

    port = 29700 + os.getpid() % 1000
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        base = Path(tmp)
        results = [run_one("prefetch_on", True, 0.0, args, base, port),
                   run_one("prefetch_off", False, 0.0, args, base, port + 1),
                   run_one("slow_producer", True, args.slow_rate, args, base, port + 2)]
    on, off = results[0], results[1]
    summary = {"results": results, "prefetch_on_over_off_steps_per_s": round(on["steps_per_s"] / off["steps_per_s"], 3),
               "idle_on": on["idle_fraction"], "idle_off": off["idle_fraction"]}
    if args.json:
        print_json(summary)
        return
    cols = ["config", "steps_per_s", "tokens_per_s", "idle_fraction", "packing_efficiency", "step_s_median",
            "publish_copy_s_median", "publish_write_s_median", "checkpoint_s_median"]
    print(" | ".join(cols))
    for r in results:
        print(" | ".join(str(r[c]) for c in cols))
    print(f"prefetch on/off throughput ratio: {summary['prefetch_on_over_off_steps_per_s']}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
