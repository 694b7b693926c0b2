"""The trainer in this process (1 rank, gloo, real DeepSpeed): smoke, publish, accounting, corrupt shards."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hpc.metrics import read_metrics
from train_node.trainer import checkpoint as ckpt
from train_node.trainer.loop import Options, Trainer

from .helpers import make_group, make_run, run_config, single_process_env, standard_groups, write_groups

pytestmark = pytest.mark.deepspeed


def _trainer(run: Path, cfg, **opts) -> Trainer:
    t = Trainer(run, cfg, Options(**opts), dist=single_process_env())
    t.setup()
    return t


def test_trains_publishes_checkpoints_and_accounts(tmp_path: Path) -> None:
    cfg = run_config(trainer={"total_steps": 3, "checkpoint_every": 2})
    paths = make_run(tmp_path / "run", cfg)
    groups = standard_groups(8)
    groups[2] = make_group("task002@e0", [1.0] * 4, np.random.default_rng(5))  # zero variance
    write_groups(paths.root, groups)
    t = _trainer(paths.root, cfg)
    assert t.run() == 0
    steps = list(read_metrics(paths.root, "train_step"))
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(np.isfinite(s["loss"]) and s["loss_tokens"] > 0 for s in steps)
    assert steps[0]["drops"].get("zero_variance") == 4
    # versions: 0 = initial weights, then one per step; LATEST written last
    assert (paths.policy / "LATEST").read_text().strip() == "3"
    # lineage: checkpoints at 2 and 3 (final)
    tags = [m["tag"] for m in ckpt.lineage(paths)]
    assert tags == ["step_000002-g1", "step_000003-g1"]
    ledger = [e for tag in tags for e in ckpt.read_ledger(paths, tag)]
    trained = [e for e in ledger if e["outcome"] == "trained"]
    assert len(trained) == 3 * 2 * 4
    assert len({e["trajectory_id"] for e in ledger}) == len(ledger)


def test_published_policy_loads_and_equals_trained_weights(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    cfg = run_config(trainer={"total_steps": 2, "checkpoint_every": 5})
    paths = make_run(tmp_path / "run", cfg)
    write_groups(paths.root, standard_groups(4))
    t = _trainer(paths.root, cfg)
    assert t.run() == 0
    trained = {k: v.detach().clone() for k, v in t.engine.module.state_dict().items()}
    version = int((paths.policy / "LATEST").read_text())
    loaded = AutoModelForCausalLM.from_pretrained(str(paths.policy_version(version)))
    sd = loaded.state_dict()
    for k, v in trained.items():
        assert torch.equal(sd[k], v), k
    initial = AutoModelForCausalLM.from_pretrained(str(paths.policy_version(0)))
    assert not torch.equal(initial.state_dict()["model.embed_tokens.weight"], trained["model.embed_tokens.weight"])


def test_freeze_embeddings_trains_the_rest_and_resumes(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    cfg = run_config(trainer={"total_steps": 2, "checkpoint_every": 2, "freeze_embeddings": True})
    paths = make_run(tmp_path / "run", cfg)
    write_groups(paths.root, standard_groups(8))
    t = _trainer(paths.root, cfg)
    assert t.run() == 0
    frozen = {id(p) for p in t.engine.module.parameters() if not p.requires_grad}
    assert frozen and all(id(p) not in frozen for g in t.engine.optimizer.param_groups for p in g["params"])
    initial = AutoModelForCausalLM.from_pretrained(str(paths.policy_version(0))).state_dict()
    after = AutoModelForCausalLM.from_pretrained(str(paths.policy_version(2))).state_dict()
    for key in ("model.embed_tokens.weight", "lm_head.weight"):
        if key in initial:
            assert torch.equal(initial[key], after[key]), key
    changed = [k for k in initial if not torch.equal(initial[k], after[k])]
    assert changed and all("embed_tokens" not in k and "lm_head" not in k for k in changed)
    # the checkpoint resumes with the frozen layout (the optimizer state holds no frozen parameter)
    cfg3 = run_config(trainer={"total_steps": 3, "checkpoint_every": 2, "freeze_embeddings": True})
    t3 = _trainer(paths.root, cfg3)
    assert t3.run() == 0
    assert [s["step"] for s in read_metrics(paths.root, "train_step")] == [1, 2, 3]
    final = AutoModelForCausalLM.from_pretrained(str(paths.policy_version(3))).state_dict()
    assert torch.equal(initial["model.embed_tokens.weight"], final["model.embed_tokens.weight"])


def test_target_kl_scales_the_lr_by_the_measured_step_and_a_resume_keeps_the_scale(tmp_path: Path) -> None:
    """trainer.target_kl: each step's KL(before || after) is measured on its batch and logged; a target far below
    it shrinks the next lr by 1.5 every step, from lr x START_SCALE, and the checkpoint carries the scale."""
    from train_node.trainer.lrschedule import FACTOR, START_SCALE

    cfg = run_config(trainer={"total_steps": 2, "checkpoint_every": 2, "lr": 1e-2, "target_kl": 1e-12})
    paths = make_run(tmp_path / "run", cfg)
    write_groups(paths.root, standard_groups(8))
    assert _trainer(paths.root, cfg).run() == 0
    cfg3 = run_config(trainer={"total_steps": 3, "checkpoint_every": 2, "lr": 1e-2, "target_kl": 1e-12})
    assert _trainer(paths.root, cfg3).run() == 0
    steps = list(read_metrics(paths.root, "train_step"))
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["step_kl"] > 0 for s in steps), "every step moved the policy, and the move was measured"
    expected = [1e-2 * START_SCALE / FACTOR**k for k in range(3)]
    assert [s["lr"] for s in steps] == pytest.approx(expected, rel=1e-9)


def test_target_kl_grows_the_lr_up_to_its_peak_when_steps_move_little(tmp_path: Path) -> None:
    from train_node.trainer.lrschedule import FACTOR, START_SCALE

    cfg = run_config(trainer={"total_steps": 3, "checkpoint_every": 10, "lr": 1e-6, "target_kl": 1e6})
    paths = make_run(tmp_path / "run", cfg)
    write_groups(paths.root, standard_groups(6))
    assert _trainer(paths.root, cfg).run() == 0
    steps = list(read_metrics(paths.root, "train_step"))
    assert [s["lr"] for s in steps] == pytest.approx([1e-6 * min(1.0, START_SCALE * FACTOR**k) for k in range(3)])
    assert all(0 <= s["step_kl"] < 1e-3 for s in steps)


def test_a_step_without_advantage_signal_leaves_the_lr(tmp_path: Path) -> None:
    """A step whose every advantage is 0 (here every reward 1) moves the policy only through the KL penalty: the
    controller keeps its scale (it would shrink it after every step at this target), and still logs the KL."""
    from train_node.trainer.lrschedule import FACTOR, START_SCALE

    cfg = run_config(trainer={"total_steps": 3, "checkpoint_every": 10, "lr": 1e-2, "target_kl": 1e-12},
                     algorithm={"drop_zero_variance": False, "kl_coef": 0.1})
    paths = make_run(tmp_path / "run", cfg)
    rng = np.random.default_rng(7)
    solved = [make_group(f"solved{i}@e0", [1.0] * 4, rng) for i in range(2)]
    groups = standard_groups(4)
    write_groups(paths.root, [*groups[:2], *solved, *groups[2:]])
    assert _trainer(paths.root, cfg).run() == 0
    steps = list(read_metrics(paths.root, "train_step"))
    assert [s["reward_mean"] for s in steps][1] == 1.0, "the second step is the solved one"
    assert [s["lr"] for s in steps] == pytest.approx([1e-2 * START_SCALE, 1e-2 * START_SCALE / FACTOR,
                                                      1e-2 * START_SCALE / FACTOR], rel=1e-9)
    assert all(s["step_kl"] >= 0 for s in steps)


def test_corrupt_shard_is_quarantined_and_training_continues(tmp_path: Path) -> None:
    cfg = run_config(trainer={"total_steps": 2, "checkpoint_every": 1})
    paths = make_run(tmp_path / "run", cfg)
    ids = write_groups(paths.root, standard_groups(6))
    bad = paths.spool / "shards" / "ready" / f"{ids[1]}.shard"
    data = bytearray(bad.read_bytes())
    data[-20] ^= 0xFF
    bad.write_bytes(bytes(data))
    t = _trainer(paths.root, cfg)
    assert t.run() == 0
    assert len(list(read_metrics(paths.root, "train_step"))) == 2
    assert (paths.spool / "shards" / "quarantine" / bad.name).exists()
    ledger = [e for m in ckpt.lineage(paths) for e in ckpt.read_ledger(paths, m["tag"])]
    assert not [e for e in ledger if e["shard_id"] == ids[1]]
    info = json.loads((paths.spool / "shards" / "quarantine" / f"{bad.name}.reason.json").read_text())
    assert info["reason"]


@pytest.mark.parametrize("estimator", ["k3", "forward"])
def test_kl_penalty_against_the_reference_model(tmp_path: Path, estimator: str) -> None:
    cfg = run_config(trainer={"total_steps": 3, "checkpoint_every": 10, "lr": 1e-2},
                     algorithm={"kl_coef": 0.1, "kl_estimator": estimator})
    paths = make_run(tmp_path / "run", cfg)
    write_groups(paths.root, standard_groups(6))
    t = _trainer(paths.root, cfg)
    assert t.engine.ref_model is not None
    assert t.engine._forward_kl == (estimator == "forward")
    assert t.run() == 0
    kls = [s["kl"] for s in read_metrics(paths.root, "train_step")]
    assert kls[0] == pytest.approx(0.0, abs=1e-9)  # the policy starts as the reference
    assert kls[-1] > 0  # and moves away from it


@pytest.mark.parametrize("prefetch", [True, False])
def test_staleness_is_judged_at_the_version_that_trains_the_batch(tmp_path: Path, prefetch: bool) -> None:
    """max_staleness 0, every sample from version 0, one publish per step: only the first batch is
    on-policy. A batch prepared (prefetched) while step 1 runs trains on version 1, so its groups are
    dropped as stale, whole, never trained one version old; without prefetch the same holds."""
    cfg = run_config(trainer={"total_steps": 3, "checkpoint_every": 10, "prefetch": prefetch},
                     algorithm={"max_staleness": 0})
    paths = make_run(tmp_path / "run", cfg)
    write_groups(paths.root, standard_groups(6))
    t = _trainer(paths.root, cfg, max_idle_s=3.0)
    assert t.run() == 0
    steps = list(read_metrics(paths.root, "train_step"))
    assert [s["step"] for s in steps] == [1]
    assert steps[0]["staleness_hist"] == {"0": 8} and steps[0]["policy_version"] == 1
    ledger = [e for m in ckpt.lineage(paths) for e in ckpt.read_ledger(paths, m["tag"])]
    assert sorted(e["outcome"] for e in ledger).count("trained") == 8
    assert {e.get("reason") for e in ledger if e["outcome"] == "dropped"} == {"stale"}
    assert len(ledger) == 6 * 4


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_trainer_says_it_waits_until_a_batch_comes(tmp_path: Path, prefetch: bool) -> None:
    """control/TRAINER_WAITING stands while the trainer has no batch (naming the step and the version that
    will train it), through several idle rounds, and goes when a batch is handed out; a dead predecessor's
    marker is removed when the trainer starts, and the trainer removes its own when it closes."""
    from hpc.records import TrainerWaiting, read_trainer_waiting, write_trainer_waiting

    cfg = run_config(trainer={"total_steps": 2, "checkpoint_every": 10, "prefetch": prefetch})
    paths = make_run(tmp_path / "run", cfg)
    write_trainer_waiting(paths, TrainerWaiting(step=9, policy_version=9, generation=0, since=0.0))
    t = _trainer(paths.root, cfg, idle_timeout_s=0.05)
    assert read_trainer_waiting(paths) is None, "a predecessor's marker is removed at start"
    assert [t.iterate(), t.iterate()] == ["idle", "idle"]
    waiting = read_trainer_waiting(paths)
    assert waiting is not None and (waiting.step, waiting.policy_version) == (1, 0)
    assert waiting.generation == t.lead.generation
    write_groups(paths.root, standard_groups(2))
    commands = [t.iterate()]
    while commands[-1] == "idle" and len(commands) < 400:  # until the batch source has claimed the shards
        commands.append(t.iterate())
    assert commands[-1] == "train" and read_trainer_waiting(paths) is None
    assert t.iterate() == "idle"
    waiting = read_trainer_waiting(paths)
    assert waiting is not None and (waiting.step, waiting.policy_version) == (2, 1)
    t.close()
    assert read_trainer_waiting(paths) is None


def test_a_fresh_trainer_replaces_policies_of_a_lineage_that_never_checkpointed(tmp_path: Path) -> None:
    """A predecessor published v1, v2 but left no checkpoint: the new trainer starts from the initial
    weights, so it publishes those as a new version before training and marks v1-v2 discarded."""
    import shutil

    from safetensors.numpy import load_file

    cfg = run_config(trainer={"total_steps": 2, "checkpoint_every": 10, "keep_policies": 10})
    paths = make_run(tmp_path / "run", cfg)
    write_groups(paths.root, standard_groups(4))
    assert _trainer(paths.root, cfg).run() == 0
    assert paths.policy_latest.read_text().strip() == "2"
    shutil.rmtree(paths.root / "checkpoints")
    (paths.root / "checkpoints").mkdir()
    t = _trainer(paths.root, cfg, max_idle_s=0.5)
    assert t.run() == 0
    assert paths.policy_latest.read_text().strip() == "3"
    initial, restored = load_file(str(paths.policy_version(0) / "model.safetensors")), \
        load_file(str(paths.policy_version(3) / "model.safetensors"))
    assert all(np.array_equal(initial[k], restored[k]) for k in initial)
    assert [r["versions"] for r in read_metrics(paths.root, "lineage_discarded")] == [[1, 2]]


def test_trainable_layers_trains_only_the_top_blocks_and_the_head(tmp_path: Path) -> None:
    """trainer.trainable_layers = 1 on the 2-block model: block 0 is unchanged after two steps and absent from
    the optimizer; block 1, the final norm and the (tied) head moved."""
    from transformers import AutoModelForCausalLM

    cfg = run_config(trainer={"total_steps": 2, "checkpoint_every": 2, "trainable_layers": 1})
    paths = make_run(tmp_path / "run", cfg)
    write_groups(paths.root, standard_groups(8))
    t = _trainer(paths.root, cfg)
    assert t.run() == 0
    named = dict(t.engine.module.named_parameters())
    in_optimizer = {id(p) for g in t.engine.optimizer.param_groups for p in g["params"]}
    trainable = {k for k, p in named.items() if id(p) in in_optimizer}
    assert trainable == {k for k, p in named.items() if p.requires_grad}
    assert trainable and all(k.startswith(("model.layers.1.", "model.norm.", "model.embed_tokens.", "lm_head."))
                             for k in trainable), sorted(trainable)
    assert any(k.startswith("model.layers.1.") for k in trainable)
    initial = AutoModelForCausalLM.from_pretrained(str(paths.policy_version(0))).state_dict()
    after = AutoModelForCausalLM.from_pretrained(str(paths.policy_version(2))).state_dict()
    below = [k for k in initial if k.startswith("model.layers.0.")]
    assert below and all(torch.equal(initial[k], after[k]) for k in below)
    assert not torch.equal(initial["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    assert any(not torch.equal(initial[k], after[k]) for k in initial if k.startswith("model.layers.1."))


def test_minibatches_make_several_updates_per_step_and_the_clip_binds_only_then(tmp_path: Path) -> None:
    """algorithm.minibatches: the same batch and weights, one update (the proximal policy is the current one:
    the PPO clip never binds) against 4 updates against the weights before the first (from the second update on,
    tokens the earlier updates moved past the clip are clipped). One version is published per step either way."""
    records = {}
    for k in (1, 4):
        cfg = run_config(trainer={"total_steps": 1, "checkpoint_every": 10, "lr": 5e-2},
                         algorithm={"minibatches": k})
        paths = make_run(tmp_path / f"run{k}", cfg)
        write_groups(paths.root, standard_groups(2))
        assert _trainer(paths.root, cfg).run() == 0
        [records[k]] = list(read_metrics(paths.root, "train_step"))
        assert paths.policy_latest.read_text().strip() == "1"
    assert (records[1]["minibatches"], records[1]["updates"], records[1]["clip_fraction"]) == (1, 1, 0.0)
    assert (records[4]["minibatches"], records[4]["updates"]) == (4, 4)
    assert records[4]["clip_fraction"] > 0
    assert records[1]["loss_tokens"] == records[4]["loss_tokens"], "every sample trained once"


def test_minibatches_beyond_the_samples_of_a_step_are_refused() -> None:
    from hpc.errors import ConfigError

    with pytest.raises(ConfigError, match=r"algorithm\.minibatches: 9 exceeds the samples of a step"):
        run_config(algorithm={"minibatches": 9})  # group_size 4 x groups_per_step 2
    assert run_config(algorithm={"minibatches": 8}).algorithm.minibatches == 8
