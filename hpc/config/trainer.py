"""Trainer and algorithm settings: the DeepSpeed engine, checkpoints, publishing and the policy-gradient loss."""

from __future__ import annotations

from typing import Literal

from hpc.config.base import knob, section


@section
class TrainerConfig:
    """The DeepSpeed engine and its schedule."""

    zero_stage: int = knob(2, doc="DeepSpeed ZeRO stage", min=0, max=3)
    precision: Literal["bf16", "fp32"] = knob("bf16", doc="training precision (fp16 is not supported)")
    total_steps: int = knob(100, doc="trainer steps of the run (one batch and one published policy version each; "
                            "algorithm.minibatches optimizer updates per step)", min=1, resumable=True)
    micro_batch_tokens: int = knob(
        4096, doc="tokens per packed micro-batch per rank; each sequence attends only to itself, "
        "at the attention cost of its own length for Llama, Qwen2/3 and Mistral models without a sliding window (of "
        "the whole micro-batch, through sdpa's block-diagonal mask, for the rest)", min=16)
    lr: float = knob(1e-6, doc="peak learning rate", min=0.0)
    weight_decay: float = knob(0.0, doc="AdamW weight decay", min=0.0)
    warmup_steps: int = knob(0, doc="linear warm-up steps", min=0)
    target_kl: float = knob(
        0.0, doc="adaptive lr (0 = off), in nats per loss token: after each step the trainer measures how far it moved "
        "the policy (the mean over the step's loss tokens of KL(before || after), on the batch it trained; one more "
        "forward pass) and scales the next step's lr down by 1.5 above twice this, up by 1.5 below half of it, never "
        "above trainer.lr; the first steps start at lr / 11. Per token, so one value suits 40-token and 10k-token "
        "trajectories alike", min=0.0,
    )
    freeze_embeddings: bool = knob(False, doc="train neither the input embeddings nor the output head (lm_head): "
                                   "the rest of the model learns to read, while the logits' common mode can no "
                                   "longer swing a whole step's worth of Adam per token row")
    trainable_layers: int = knob(
        0, doc="train only the top N transformer blocks, the final norm and the output head (with tied embeddings, "
        "as in SmolLM2, the head is the input embedding); the rest is frozen and not in the optimizer, so a step "
        "costs less (0 = train every layer; N above the model's blocks is refused)", min=0)
    grad_clip: float = knob(1.0, doc="gradient-norm clipping (0 = off)", min=0.0)
    max_nonfinite_steps: int = knob(
        3, doc="a NaN or infinite loss or gradient norm on any rank skips that optimizer update on every rank "
        "(nothing applied, nothing published; counted as nonfinite_steps in the metrics); this many such steps in a "
        "row stop the trainer with an error", min=1, resumable=True)
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
    """The policy-gradient objective: REINFORCE with a baseline, token-level truncated importance sampling and an
    optional KL penalty; the PPO clip acts only between the minibatches of a step (``minibatches`` > 1)."""

    group_size: int = knob(4, doc="samples per task (a GRPO group)", min=1)
    groups_per_step: int = knob(4, doc="task groups per trainer step", min=1)
    minibatches: int = knob(
        1, doc="optimizer updates per trainer step (AReaL's ppo_n_minibatches): the step's samples are split into this "
        "many minibatches balanced by loss tokens, one update each, every sample trained once; the proximal policy is "
        "the weights before the first update (one more forward pass over the batch when > 1), so from the second "
        "update on the PPO clip binds. 1: one update per batch and the clip never binds", min=1)
    clip_low: float = knob(0.2, doc="PPO clip around the proximal policy (the weights at the start of the step): "
                           "pi/pi_prox >= 1 - clip_low; it binds only with minibatches > 1 (off-policy samples are "
                           "corrected by tis_cap)", min=0.0, max=1.0)
    clip_high: float = knob(0.28, doc="PPO clip around the proximal policy: pi/pi_prox <= 1 + clip_high (DAPO "
                            "clip-higher); binds only with minibatches > 1", min=0.0)
    kl_coef: float = knob(0.0, doc="weight of the KL penalty against the reference model (0 = off)", min=0.0)
    kl_estimator: Literal["k3", "forward"] = knob(
        "k3", doc="the KL penalty per loss token: 'k3' from the sampled token alone (exp(d) - d - 1 with d = "
        "log ref - log pi clamped to +-20, the value to 10, as veRL and OpenRLHF do); its expected gradient on-policy "
        "is that of KL(ref || pi), below the cap (a token with ref/pi above ~12.7 gets no pull). 'forward' computes KL(ref || pi) exactly over the whole vocabulary (one more fp32 "
        "head pass): the same expected gradient without the sampling variance, so a token the policy rarely samples "
        "is pulled back smoothly instead of by a rare, huge k3 term")
    tis_cap: float = knob(2.0, doc="decoupled off-policy correction: each token's loss is weighted by the detached, "
                          "truncated importance weight min(pi/mu, tis_cap) against the behaviour policy mu", min=1.0)
    max_staleness: int = knob(4, doc="the one staleness limit (policy versions between the weights that train a "
                              "sample and its oldest token): rollout nodes cancel episodes that would exceed it, the "
                              "trainer drops whole groups that do", min=0)
    truncated: Literal["score", "mask"] = knob(
        "score", doc="episodes that ran out of turns/tokens/context: 'score' trains them with their reward; 'mask' "
        "keeps their reward in the baseline but trains none of their tokens")
    timeout: Literal["score", "mask"] = knob(
        "score", doc="episodes past rollout.run_timeout_s: 'score' or 'mask' as for truncated. The clock counts tool "
        "and sandbox time only (waiting for the inference server does not count), so a timeout is the agent's own "
        "commands' doing and is scored by default; infrastructure faults keep their own statuses, never trained "
        "(a sandbox that cannot start: sandbox_error; no inference server answering: inference_error)")
    control_shuffle_rewards: bool = knob(
        False, doc="a CONTROL for benchmarks, never for training a policy: each step's rewards are permuted across "
        "its episodes before the advantages are computed, so the step carries no information about which episode "
        "earned what (scripts/bench_learning_real.py's shuffled arm; the logged reward stays the real one)")
    drop_zero_variance: bool = knob(True, doc="drop groups whose rewards are all equal (DAPO dynamic sampling)")
    advantage_norm: Literal["group_std", "group_mean", "batch_mean", "batch_std"] = knob(
        "group_std", doc="the baseline: 'group_std': (r - mean) / std within each group (GRPO); 'group_mean': r - mean "
        "(Dr. GRPO); 'batch_mean' / 'batch_std': the same over every sample of the step (batch_std is REINFORCE++'s), so "
        "a group whose samples all failed still pushes their answers down (unless drop_zero_variance drops it first). "
        "The batch baselines suit steps stratified by construction (tasks of equal difficulty in every step, as in the "
        "demo); on real task sets, whose pass rates differ per task, use a group baseline"
    )

    def check(self) -> list[str]:
        samples = self.group_size * self.groups_per_step
        if self.minibatches > samples:
            return [f"minibatches: {self.minibatches} exceeds the samples of a step (group_size x groups_per_step = "
                    f"{samples}); every minibatch needs a sample: lower minibatches"]
        return []
