"""Shared fixtures for trainer tests: a tiny Qwen2 run directory and synthetic trajectory groups."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from hpc.config import RunConfig, config_from_dict
from hpc.paths import RunPaths
from hpc.rundir import create_run
from hpc.trajectory import Status, Trajectory
from train_node.trainer.dist_env import free_port

VOCAB = 300
T = TypeVar("T")


def with_flipped_advantages(loss_fn: Callable[..., T]) -> Callable[..., T]:
    """``policy_loss`` with every advantage negated: the negative control's objective.

    Test-side only: a test that needs it patches it in where the engine looks the loss up
    (``train_node.trainer.engine.policy_loss``); production code carries no sign knob."""

    def flipped(logp: Any, behaviour_logp: Any, advantages: Any, mask: Any, **kwargs: Any) -> T:
        return loss_fn(logp, behaviour_logp, -advantages, mask, **kwargs)

    return flipped


def tiny_model(path: Path, seed: int = 0, vocab: int = VOCAB) -> None:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(str(path))


def run_config(**sections: dict[str, Any]) -> RunConfig:
    data: dict[str, Any] = {
        "trainer": {"zero_stage": 0, "precision": "fp32", "total_steps": 1000, "micro_batch_tokens": 256,
                    "lr": 1e-3, "checkpoint_every": 2, "publish_every": 1, "prefetch": True},
        "algorithm": {"group_size": 4, "groups_per_step": 2, "max_staleness": 1000},
        "spool": {"poll_interval_s": 0.05, "shard_max_age_s": 0.5},
        "slurm": {"train": {"gpus_per_node": 0}},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return config_from_dict(data)


def make_run(root: Path, cfg: RunConfig, seed: int = 0) -> RunPaths:
    return create_run(root, cfg, prepare=lambda paths, _c: tiny_model(paths.model, seed))


def make_group(task: str, rewards: list[float], rng: np.random.Generator, *, prompt_len: int = 6,
               gen_len: int = 10, version: int = 0, vocab: int = VOCAB, status: str = "ok",
               group: str | None = None) -> list[Trajectory]:
    """Synthetic samples: random ids, plausible negative behaviour logprobs."""
    out = []
    for i, r in enumerate(rewards):
        n = prompt_len + int(rng.integers(gen_len // 2, gen_len + 1))
        mask = np.zeros(n, dtype=np.int8)
        mask[prompt_len:] = 1
        lp = np.where(mask == 1, -rng.uniform(4.0, 7.0, n), 0.0).astype(np.float32)
        pv = np.where(mask == 1, version, -1).astype(np.int32)
        out.append(Trajectory(trajectory_id=f"{task}/s{i}", task_id=task, group_id=group or task, sample_index=i,
                              token_ids=rng.integers(3, vocab, n).astype(np.int32), loss_mask=mask, logprobs=lp,
                              policy_versions=pv, reward=r, status=Status(status), sampling={"temperature": 1.0},
                              logprob_kind="processed"))
    return out


def write_groups(run_dir: Path, groups: list[list[Trajectory]], worker: str = "producer") -> list[str]:
    """One shard per group, in order."""
    from hpc.spool import Spool

    spool = Spool(run_dir)
    with spool.writer(worker) as w:
        for g in groups:
            w.add_group(g)
            w.flush()
        return list(w.published)


def standard_groups(n: int, seed: int = 0, group_size: int = 4) -> list[list[Trajectory]]:
    rng = np.random.default_rng(seed)
    return [make_group(f"task{i:03d}@e0", [1.0, 0.0] + [float(x) for x in rng.integers(0, 2, group_size - 2)], rng)
            for i in range(n)]


def single_process_env(port: int | None = None) -> Any:
    from train_node.trainer.dist_env import DistEnv

    return DistEnv(rank=0, local_rank=0, world_size=1, master_addr="127.0.0.1",
                   master_port=port or int(os.environ.get("SPOOLRL_TEST_PORT", free_port())), source="single")
