"""It learns through the spool: a tiny random model, a toy reward, trajectories as spool records.

Reward = fraction of the 8 generated tokens that fall in a target set (10 % of the vocabulary), so
a random model starts near 0.1. Samples come from the trainer's own model in this process (the
stand-in for an inference server that reloads every step), are written to the spool as real shards,
and are consumed by the real trainer loop (DeepSpeed, ZeRO-2, fp32). Negative control: the same
with the advantage sign flipped (the engine's loss patched by the test) must not learn.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hpc.spool import Spool
from hpc.trajectory import Trajectory
from train_node.trainer import engine
from train_node.trainer.loop import Options, Trainer

from .helpers import make_run, run_config, single_process_env, with_flipped_advantages

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(600)]

VOCAB, PROMPT, GEN, GROUP, GROUPS = 300, 2, 8, 8, 4
TARGET = torch.arange(3, 3 + VOCAB // 10)


def sample_groups(model: torch.nn.Module, step: int, version: int) -> list[list[Trajectory]]:
    """GROUPS groups of GROUP samples at temperature 1, raw logprobs recorded at sampling time."""
    prompts = torch.tensor([[1, 40 + (step * GROUPS + g) % 50] for g in range(GROUPS) for _ in range(GROUP)])
    ids, logps = prompts, []
    model.eval()
    with torch.no_grad():
        for _ in range(GEN):
            logits = model(input_ids=ids, use_cache=False).logits[:, -1].float()
            lp = torch.log_softmax(logits, -1)
            tok = torch.multinomial(lp.exp(), 1)
            logps.append(lp.gather(-1, tok))
            ids = torch.cat([ids, tok], 1)
    model.train()
    gen = ids[:, PROMPT:]
    rewards = torch.isin(gen, TARGET).float().mean(1)
    lp_all = torch.cat(logps, 1)
    out = []
    for g in range(GROUPS):
        group = []
        for i in range(GROUP):
            r = g * GROUP + i
            mask = np.r_[np.zeros(PROMPT), np.ones(GEN)].astype(np.int8)
            task = f"s{step}-g{g}@e0"
            group.append(Trajectory(
                trajectory_id=f"{task}/{i}", task_id=task, group_id=task, sample_index=i,
                token_ids=ids[r].numpy().astype(np.int32), loss_mask=mask,
                logprobs=np.r_[np.zeros(PROMPT), lp_all[r].numpy()].astype(np.float32),
                policy_versions=np.where(mask == 1, version, -1).astype(np.int32),
                reward=float(rewards[r]), sampling={"temperature": 1.0}, logprob_kind="processed"))
        out.append(group)
    return out


def train_toy(root: Path, seed: int, *, max_steps: int, stop_at: float | None) -> list[float]:
    cfg = run_config(
        trainer={"zero_stage": 2, "lr": 2e-2, "total_steps": 10_000, "checkpoint_every": 10_000, "publish_every": 50,
                 "prefetch": False, "micro_batch_tokens": 512},
        algorithm={"group_size": GROUP, "groups_per_step": GROUPS, "clip_high": 0.28},
        run={"seed": seed})
    paths = make_run(root, cfg, seed=seed)
    torch.manual_seed(seed)
    trainer = Trainer(paths.root, cfg, Options(idle_timeout_s=0.1), dist=single_process_env())
    trainer.setup()
    spool = Spool(paths.root, cfg.spool)
    means: list[float] = []
    try:
        for step in range(max_steps):
            groups = sample_groups(trainer.engine.module, step, trainer.lead.publisher.version)
            means.append(float(np.mean([t.reward for g in groups for t in g])))
            with spool.writer("toy-rollout") as w:
                for g in groups:
                    w.add_group(g)
            for _ in range(3):  # all groups can be dropped (zero variance once it has learned): then sample again
                if trainer.iterate() != "idle":
                    break
            if stop_at is not None and len(means) >= 5 and np.mean(means[-5:]) >= stop_at:
                break
    finally:
        trainer.close()
    return means


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reward_rises_through_the_spool(tmp_path: Path, seed: int) -> None:
    means = train_toy(tmp_path / "run", seed, max_steps=300, stop_at=0.85)
    assert means[0] <= 0.2, means[:5]
    assert np.mean(means[-5:]) >= 0.8, (len(means), means[-10:])


def test_flipped_advantage_does_not_learn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "policy_loss", with_flipped_advantages(engine.policy_loss))
    means = train_toy(tmp_path / "run", 0, max_steps=25, stop_at=None)
    assert means[0] <= 0.2
    assert np.mean(means[-5:]) < 0.1, means[-10:]
