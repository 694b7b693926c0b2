"""Trainer and algorithm settings: the DeepSpeed engine, checkpoints, publishing and the GRPO/DAPO loss."""

from __future__ import annotations

from typing import Literal

from hpc.config.base import knob, section


@section
class TrainerConfig:
    """The DeepSpeed engine and its schedule."""

    zero_stage: int = knob(2, doc="DeepSpeed ZeRO stage", min=0, max=3)
    precision: Literal["bf16", "fp32"] = knob("bf16", doc="training precision (fp16 is not supported)")
    total_steps: int = knob(100, doc="optimizer steps of the run", min=1, resumable=True)
    micro_batch_tokens: int = knob(4096, doc="tokens per packed micro-batch per rank", min=16)
    lr: float = knob(1e-6, doc="peak learning rate", min=0.0)
    weight_decay: float = knob(0.0, doc="AdamW weight decay", min=0.0)
    warmup_steps: int = knob(0, doc="linear warm-up steps", min=0)
    target_kl: float = knob(
        0.0, doc="adaptive lr (0 = off): after each step the trainer measures how far it moved the policy (mean "
        "per-sample KL between before and after, on the batch it trained; one more forward pass) and scales the "
        "next step's lr down by 1.5 above twice this, up by 1.5 below half of it, never above trainer.lr; the first "
        "steps start at lr / 11", min=0.0,
    )
    freeze_embeddings: bool = knob(False, doc="train neither the input embeddings nor the output head (lm_head): "
                                   "the rest of the model learns to read, while the logits' common mode can no "
                                   "longer swing a whole step's worth of Adam per token row")
    trainable_layers: int = knob(
        0, doc="train only the top N transformer blocks, the final norm and the output head (with tied embeddings, "
        "as in SmolLM2, the head is the input embedding); the rest is frozen and not in the optimizer, so a step "
        "costs less (0 = train every layer; N above the model's blocks is refused)", min=0)
    grad_clip: float = knob(1.0, doc="gradient-norm clipping (0 = off)", min=0.0)
    max_seq_len: int = knob(8192, doc="longer trajectories are dropped (reason 'too_long')", min=8)
    activation_checkpointing: bool = knob(False, doc="recompute activations in backward (long sequences)")
    checkpoint_every: int = knob(10, doc="save a checkpoint (and commit the spool) every K steps", min=1,
                                 resumable=True)
    publish_every: int = knob(1, doc="publish policy weights every N steps", min=1, resumable=True)
    keep_policies: int = knob(3, doc="published policy versions kept on disk", min=1, resumable=True)
    keep_checkpoints: int = knob(2, doc="checkpoints kept on disk", min=1, resumable=True)
    prefetch: bool = knob(True, doc="prepare the next batch while a step trains", resumable=True)
    max_tasks_outstanding: int = knob(16, doc="tasks in the queue not yet trained (feeder backpressure)", min=1,
                                      resumable=True)


@section
class AlgorithmConfig:
    """The clipped policy-gradient objective (GRPO/DAPO family)."""

    group_size: int = knob(4, doc="samples per task (a GRPO group)", min=1)
    groups_per_step: int = knob(4, doc="task groups per optimizer step", min=1)
    clip_low: float = knob(0.2, doc="PPO clip around the proximal policy: pi/pi_prox >= 1 - clip_low (the "
                           "proximal policy is the weights at the start of the step, so with one optimizer step per "
                           "batch the clip never binds; off-policy samples are corrected by tis_cap)", min=0.0, max=1.0)
    clip_high: float = knob(0.28, doc="PPO clip around the proximal policy: pi/pi_prox <= 1 + clip_high (DAPO "
                            "clip-higher)", min=0.0)
    kl_coef: float = knob(0.0, doc="weight of the KL penalty against the reference model (0 = off)", min=0.0)
    kl_estimator: Literal["k3", "forward"] = knob(
        "k3", doc="the KL penalty per loss token: 'k3' estimates the KL of the policy from the reference with the "
        "sampled token alone; 'forward' is the exact KL of the reference from the policy, KL(ref, pi), over the "
        "whole vocabulary, whose pull back onto a token the policy stopped sampling does not vanish with its "
        "probability (one more fp32 head pass)")
    tis_cap: float = knob(2.0, doc="decoupled off-policy correction: each token's loss is weighted by the detached, "
                          "truncated importance weight min(pi/mu, tis_cap) against the behaviour policy mu", min=1.0)
    max_staleness: int = knob(4, doc="the one staleness limit (policy versions between the weights that train a "
                              "sample and its oldest token): rollout nodes cancel episodes that would exceed it, the "
                              "trainer drops whole groups that do", min=0)
    truncated: Literal["score", "mask"] = knob(
        "score", doc="episodes that ran out of turns/tokens/context: 'score' trains them with their reward; 'mask' "
        "keeps their reward in the baseline but trains none of their tokens")
    timeout: Literal["score", "mask"] = knob(
        "mask", doc="episodes past rollout.run_timeout_s (tool and sandbox time; waiting for the inference server "
        "does not count): 'score' or 'mask' as for truncated")
    control_shuffle_rewards: bool = knob(
        False, doc="a CONTROL for benchmarks, never for training a policy: each step's rewards are permuted across "
        "its episodes before the advantages are computed, so the step carries no information about which episode "
        "earned what (scripts/bench_learning_real.py's shuffled arm; the logged reward stays the real one)")
    drop_zero_variance: bool = knob(True, doc="drop groups whose rewards are all equal (DAPO dynamic sampling)")
    advantage_norm: Literal["group_std", "group_mean", "batch_mean", "batch_std"] = knob(
        "group_std", doc="the baseline: 'group_std': (r - mean) / std within each group (GRPO); 'group_mean': r - mean "
        "(Dr. GRPO); 'batch_mean' / 'batch_std': the same over every sample of the step (batch_std is REINFORCE++'s), so "
        "a group whose samples all failed still pushes their answers down (unless drop_zero_variance drops it first)"
    )
