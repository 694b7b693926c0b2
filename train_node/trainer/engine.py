"""The DeepSpeed engine: configuration from ``run.yaml``, one optimizer step over packed micro-batches.

Guarantees:
- One ``train_step`` = one optimizer update per minibatch (``algorithm.minibatches``, 1 by default),
  whatever the number of micro-batches: DeepSpeed runs with ``managed_gradient_accumulation: false``
  (backward only accumulates, ``step()`` is the boundary), so the micro-batch count may differ from
  step to step (token-based packing). With several minibatches the proximal logprobs come from one
  forward pass over the whole batch before the first update.
- Gradients equal those of the token-mean loss over the update's tokens: each micro-batch loss is
  divided by the minibatch's global loss-token count (all-reduced) and multiplied by the world size,
  which undoes DeepSpeed's data-parallel gradient averaging.
- Non-finite guard: an update whose loss or gradient is NaN or infinite on any rank applies nothing on
  every rank (the optimizer, its state and the lr schedule stay as they were; the flag is all-reduced
  inside the optimizer's step, after DeepSpeed's reduction and clipping, and DeepSpeed's own overflow
  skip under ZeRO-1/2 counts too). The step then stops (:attr:`StepResult.nonfinite`); the trainer
  publishes nothing for it.
- The optimizer is a client ``torch.optim.AdamW`` (no JIT build of DeepSpeed's fused Adam) and the
  schedule a client ``LambdaLR`` (linear warm-up, then constant); both are saved in checkpoints.
- CPU (tests, demo): gloo, fp32; GPU: NCCL, bf16. fp16 is refused by the config already.
- ``trainer.freeze_embeddings``: the input embeddings and lm_head get no gradient and are not in the
  optimizer; they are still in every checkpoint and published policy (unchanged).
- ``trainer.trainable_layers``: the same for everything below the top N blocks (``layers.py``).
- Each sequence of a packed micro-batch attends only to itself: computed one sequence at a time (``attention.py``)
  for the families checked there (Llama, Qwen2/3, Mistral) without sliding windows, through ``sdpa``'s
  block-diagonal mask over the whole micro-batch for the rest.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
import torch.utils.checkpoint

from hpc.config import AlgorithmConfig, TrainerConfig
from hpc.errors import SpoolrlError
from train_node.trainer import attention as packed_attention
from train_node.trainer.dist_env import DistEnv, free_port
from train_node.trainer.faults import fault_point
from train_node.trainer.layers import train_top_layers
from train_node.trainer.loss import LossParams, LossSums, forward_kl, policy_loss, token_logprobs
from train_node.trainer.lrschedule import LrSchedule, apply_now, kl_totals, mean_token_kl
from train_node.trainer.packing import MicroBatch


def ds_config(tcfg: TrainerConfig, *, load_universal: bool = False) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": tcfg.grad_clip,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": tcfg.zero_stage},
        "checkpoint": {"load_universal": load_universal},
    }
    if tcfg.zero_stage == 3:
        cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    if tcfg.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


PORT_TRIES = 5  # rendezvous ports a single trainer tries when the one it picked was taken meanwhile


def init_distributed(env: DistEnv) -> str:
    """Start torch.distributed through DeepSpeed; returns the backend (nccl on GPUs, gloo on CPU). The
    rendezvous variables are in ``os.environ`` only while it runs (:meth:`DistEnv.exported`)."""
    env.export_local_rank()
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "gloo":
        _skip_shm_comm_op()
    if not tdist.is_initialized():
        _rendezvous(env, backend)
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank)
    return backend


def _rendezvous(env: DistEnv, backend: str) -> None:
    """``deepspeed.init_distributed``. A port this process picked (``env.port_picked``: a single trainer) was
    free a moment ago, and another process on the host can bind it first (seen with several test suites on
    one machine: EADDRINUSE); then another free port, up to :data:`PORT_TRIES` in all. A port a launcher or
    Slurm gave is used as given."""
    import deepspeed

    for attempt in range(1, PORT_TRIES + 1):
        try:
            with env.exported():
                deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
            return
        except tdist.DistNetworkError as exc:
            if not env.port_picked or "EADDRINUSE" not in str(exc) or attempt == PORT_TRIES:
                raise
            env = replace(env, master_port=free_port())


def _skip_shm_comm_op() -> None:
    """On CPU, DeepSpeed JIT-compiles a shared-memory collective op at its first init (30-180 s on a
    fresh machine) under a file lock in ~/.cache/torch_extensions; a process SIGKILLed while holding
    that lock makes every later init wait forever (seen in the chaos test). The op only speeds up
    DeepSpeed-inference all-reduces; training collectives go through torch.distributed (gloo). So the
    trainer marks it incompatible and never builds or loads it."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def load_model(model_dir: str | Path, precision: str, activation_checkpointing: bool) -> torch.nn.Module:
    """The trainer's model: dropout off, and each packed sequence's attention computed alone
    (:mod:`~train_node.trainer.attention`) where that is checked to equal ``sdpa``, ``sdpa`` otherwise."""
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    attention = attention_impl(AutoConfig.from_pretrained(str(model_dir)))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation=attention)
    disable_dropout(model)
    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model


def attention_impl(config: Any) -> str:
    """``attn_implementation`` for the trainer's models of this config: the packed per-sequence attention when it
    computes the same thing as ``sdpa`` (:func:`~train_node.trainer.attention.fits`), else ``sdpa``."""
    return packed_attention.register() if packed_attention.fits(config) else "sdpa"


def disable_dropout(model: torch.nn.Module) -> None:
    """Dropout off everywhere: ``train()`` mode must not make the trained logprobs noisy (pi/mu != 1)."""
    for cfg in (model.config, *[getattr(model.config, k) for k in ("text_config",) if hasattr(model.config, k)]):
        for key, value in list(vars(cfg).items()):
            if "dropout" in key and isinstance(value, float):
                setattr(cfg, key, 0.0)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for key in ("attention_dropout", "dropout"):
            if isinstance(getattr(module, key, None), float):
                setattr(module, key, 0.0)


def fp32_head_logprobs(module: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                       targets: torch.Tensor, inv_t: torch.Tensor, chunk_tokens: int,
                       mask: torch.Tensor | None = None) -> torch.Tensor | None:
    """``log_softmax(logits / T)[target]`` with the LM head applied in fp32, ``chunk_tokens`` positions
    at a time under activation checkpointing, so the [N, V] logits never exist whole (not in bf16, not
    in fp32). With ``mask``, the head runs only where it is non-zero (:func:`loss_positions`). None when
    the model does not split into a decoder and a plain linear head."""
    split = _decoder_and_head(module)
    if split is None:
        return None
    decoder, head = split
    hidden = _hidden(decoder, input_ids, position_ids)
    return _at_loss_positions(mask, lambda *rows: _checkpointed_chunks(_head_chunk, rows, (head.weight, head.bias),
                                                                      chunk_tokens), hidden, targets, inv_t)


def loss_positions(mask: torch.Tensor) -> torch.Tensor:
    """The positions whose logprob a loss can read (``mask`` non-zero). Everything the trainer computes from a
    logprob is multiplied by the loss mask, so the LM head, which costs ``2 x hidden x vocab`` FLOPs per position
    each way (most of a small model's step), runs on these only: an agent trajectory's prompt, observations and
    chat-template tokens are most of its positions and none of its loss."""
    return mask.nonzero().squeeze(-1)


def scatter_positions(values: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    """``values`` at ``idx`` of a length-``n`` vector, 0 elsewhere (where the loss mask is 0); differentiable."""
    return torch.zeros(n, *values.shape[1:], dtype=values.dtype, device=values.device).index_copy(0, idx, values)


def _at_loss_positions(mask: torch.Tensor | None, fn: Callable[..., torch.Tensor],
                       *rows: torch.Tensor) -> torch.Tensor:
    """``fn(*rows)`` computed only at the :func:`loss_positions` of ``mask`` (each of ``rows`` indexed by position)
    and scattered back to every position, 0 elsewhere; at every position when ``mask`` is None."""
    if mask is None:
        return fn(*rows)
    idx = loss_positions(mask)
    return scatter_positions(fn(*(r[idx] for r in rows)), idx, mask.shape[0])


def fp32_head_logprobs_and_forward_kl(module: torch.nn.Module, ref: torch.nn.Module, input_ids: torch.Tensor,
                                      position_ids: torch.Tensor, targets: torch.Tensor, inv_t: torch.Tensor,
                                      chunk_tokens: int, mask: torch.Tensor | None = None
                                      ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(:func:`fp32_head_logprobs`, the per-position :func:`~train_node.trainer.loss.forward_kl` against
    ``ref``), both heads in fp32 over ``chunk_tokens`` positions at a time under activation
    checkpointing, and only where ``mask`` is non-zero when it is given (0 elsewhere); None when either
    model does not split into a decoder and a plain linear head."""
    split, ref_split = _decoder_and_head(module), _decoder_and_head(ref)
    if split is None or ref_split is None:
        return None
    (decoder, head), (ref_decoder, ref_head) = split, ref_split
    hidden = _hidden(decoder, input_ids, position_ids)
    with torch.no_grad():
        ref_hidden = _hidden(ref_decoder, input_ids, position_ids)
    weights = (head.weight, head.bias, ref_head.weight, ref_head.bias)
    both = _at_loss_positions(mask, lambda *rows: _checkpointed_chunks(_head_chunk_kl, rows, weights, chunk_tokens),
                              hidden, ref_hidden, targets, inv_t)
    return both[:, 0], both[:, 1]


def freeze_embeddings(model: torch.nn.Module) -> int:
    """Stop training the input embeddings and the output head (``trainer.freeze_embeddings``); returns the number
    of parameters frozen. Tied weights are one parameter, frozen once."""
    frozen = 0
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        get = getattr(model, getter, None)
        layer = get() if callable(get) else None
        if layer is None:
            raise ValueError(f"trainer.freeze_embeddings: the model has no {getter.split('_', 1)[1]} "
                             f"({type(model).__name__}.{getter}() returned nothing); set it to false")
        for p in layer.parameters():
            frozen += p.numel() if p.requires_grad else 0
            p.requires_grad_(False)
    return frozen


def _decoder_and_head(module: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Linear] | None:
    get_decoder, get_head = getattr(module, "get_decoder", None), getattr(module, "get_output_embeddings", None)
    decoder = get_decoder() if callable(get_decoder) else None
    head = get_head() if callable(get_head) else None
    cfg = getattr(module, "config", None)
    if decoder is None or not isinstance(head, torch.nn.Linear) or getattr(cfg, "final_logit_softcapping", None):
        return None
    return decoder, head


def _hidden(decoder: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    return decoder(input_ids=input_ids.unsqueeze(0), position_ids=position_ids.unsqueeze(0),
                   use_cache=False).last_hidden_state[0]


def chunked_head_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, inv_t: torch.Tensor,
                          chunk_tokens: int) -> torch.Tensor:
    """The fp32 head + logprobs over ``chunk_tokens`` positions at a time, each chunk recomputed in backward."""
    return _checkpointed_chunks(_head_chunk, (hidden, targets, inv_t), (head.weight, head.bias), chunk_tokens)


def _checkpointed_chunks(fn: Callable[..., torch.Tensor], rows: tuple[torch.Tensor, ...],
                         params: tuple[torch.Tensor | None, ...], chunk_tokens: int) -> torch.Tensor:
    """``fn(*row slices, *params)`` on ``chunk_tokens`` positions at a time, each chunk under activation
    checkpointing (recomputed in backward), concatenated along the positions. One call on no positions at all
    (a micro-batch whose loss mask is 0 everywhere), so the result has its shape and dtype."""
    n = rows[0].shape[0]
    return torch.cat([torch.utils.checkpoint.checkpoint(fn, *(r[lo:lo + chunk_tokens] for r in rows), *params,
                                                        use_reentrant=False)
                      for lo in range(0, max(n, 1), chunk_tokens)])


def _head_chunk(hidden: torch.Tensor, targets: torch.Tensor, inv_t: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    return token_logprobs(_fp32_logits(hidden, weight, bias), targets, inv_t)


def _head_chunk_kl(hidden: torch.Tensor, ref_hidden: torch.Tensor, targets: torch.Tensor, inv_t: torch.Tensor,
                   weight: torch.Tensor, bias: torch.Tensor | None, ref_weight: torch.Tensor,
                   ref_bias: torch.Tensor | None) -> torch.Tensor:
    """[positions, 2]: the logprob of the target and the forward KL to the reference, at each position."""
    logits, ref_logits = _fp32_logits(hidden, weight, bias), _fp32_logits(ref_hidden, ref_weight, ref_bias).detach()
    return torch.stack([token_logprobs(logits, targets, inv_t), forward_kl(logits, ref_logits, inv_t)], dim=-1)


def _fp32_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(hidden.float(), weight.float(), None if bias is None else bias.float())


# positions per chunk of the fp32 LM head: 1024 x 152k vocab x 4 B = 0.6 GB of logits at a time
HEAD_CHUNK_TOKENS = 1024


class NonFiniteError(SpoolrlError):
    """``trainer.max_nonfinite_steps`` steps in a row had a NaN or infinite loss or gradient norm."""


@dataclass
class StepResult:
    sums: LossSums
    grad_norm: float | None  # None: not computed (grad_clip 0 at ZeRO-0 fp32); non-finite only with nonfinite
    lr: float  # the lr of the step's first update
    tokens: int
    seconds: float
    step_kl: float | None = None  # KL(before || after the step) per loss token; None without trainer.target_kl
    updates: int = 1  # optimizer updates applied (algorithm.minibatches unless one was non-finite)
    nonfinite: str = ""  # '': every update applied; else what was NaN/inf on some rank ('loss', 'grad_norm')


class GuardedAdamW(torch.optim.AdamW):
    """The client optimizer with the non-finite guard: :meth:`step` all-reduces whether any rank saw a
    non-finite loss (``loss_finite``, set by the engine before each update) or gradient, and applies
    nothing when one did. DeepSpeed calls it on every rank after its reduction and clipping (or, on its
    own overflow skip under ZeRO-1/2, on none), so the collective is matched."""

    def __init__(self, params: Any, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.loss_finite = True
        self.norm_finite = True  # ZeRO-0 fp32: the clipping's norm (an overflowed norm with finite grads)
        self.skipped = ""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        device = self.param_groups[0]["params"][0].device  # the backend's device (NCCL needs CUDA tensors)
        grads_finite = torch.stack([torch.isfinite(g).all() for g in grads]).all() if grads else torch.tensor(True)
        bad = torch.stack([torch.tensor(not self.loss_finite, device=device),
                           ~grads_finite.to(device) | (not self.norm_finite)]).float()
        tdist.all_reduce(bad, op=tdist.ReduceOp.MAX)
        self.skipped = "loss" if bad[0] > 0 else "grad_norm" if bad[1] > 0 else ""
        return None if self.skipped else super().step(closure)


@dataclass
class _Update:
    sums: LossSums
    lr: float
    nonfinite: str
    before: list[tuple[dict[str, torch.Tensor], torch.Tensor]]  # (tensors, logprobs before the step) per micro-batch


class Engine:
    """A DeepSpeed engine with the GRPO step; every rank calls every method (they are collectives)."""

    def __init__(self, model: torch.nn.Module, tcfg: TrainerConfig, acfg: AlgorithmConfig, *,
                 load_universal: bool = False, ref_model: torch.nn.Module | None = None) -> None:
        import deepspeed

        self.tcfg = tcfg
        self.params = LossParams.from_config(acfg)
        train_top_layers(model, tcfg.trainable_layers)
        if tcfg.freeze_embeddings:
            freeze_embeddings(model)
        self.guard = GuardedAdamW([p for p in model.parameters() if p.requires_grad], lr=tcfg.lr,
                                  weight_decay=tcfg.weight_decay)
        optimizer = self.guard
        self.schedule = LrSchedule(tcfg.warmup_steps, tcfg.target_kl)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, self.schedule)
        self.ds, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=schedule,
            config=ds_config(tcfg, load_universal=load_universal))
        self.world = tdist.get_world_size()
        self.rank = tdist.get_rank()
        self.device = self.ds.device
        self.ref_model = ref_model.to(self.device).eval() if ref_model is not None else None
        self._z0_grad_norm: float | None = None
        if tcfg.zero_stage == 0 and tcfg.precision == "fp32":
            # DeepSpeed computes the ZeRO-0 fp32 norm in clip_fp32_gradients but drops it (its
            # get_global_grad_norm() stays None); keep the value it computed.
            self.ds.clip_fp32_gradients = self._clip_fp32_and_keep_norm

    def _clip_fp32_and_keep_norm(self) -> None:
        from deepspeed.runtime.utils import clip_grad_norm_

        norm = clip_grad_norm_(parameters=self.ds.module.parameters(), max_norm=self.tcfg.grad_clip, mpu=self.ds.mpu)
        self._z0_grad_norm = float(norm)
        self.guard.norm_finite = math.isfinite(self._z0_grad_norm)

    def _grad_norm(self) -> float | None:
        """The global gradient norm of the step (before clipping); None only without clipping at ZeRO-0."""
        norm = self.ds.get_global_grad_norm()
        if norm is None:
            norm, self._z0_grad_norm = self._z0_grad_norm, None
        return None if norm is None else float(norm)

    @property
    def module(self) -> torch.nn.Module:
        return self.ds.module  # type: ignore[no-any-return]

    def _tensors(self, mb: MicroBatch) -> dict[str, torch.Tensor]:
        arrays = {"input_ids": mb.input_ids, "position_ids": mb.position_ids, "targets": mb.targets,
                  "mask": mb.mask, "behaviour": mb.behaviour_logprobs, "adv": mb.advantages,
                  "inv_t": mb.inv_temperature, "staleness": mb.staleness}
        return {k: torch.from_numpy(v).to(self.device) for k, v in arrays.items()}

    def logprobs(self, module: torch.nn.Module, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-position logprob of the next token at the sampling temperature (packed, no attention mask).

        The LM head runs in fp32, chunked, and only at the loss positions (:func:`fp32_head_logprobs`: the
        others read 0, and nothing reads them); under ZeRO-3 (the head's weight is partitioned outside its
        own forward) and for heads that are not a plain linear layer, the model's own logits, at every
        position, are upcast to fp32 instead."""
        inner = module.module if isinstance(getattr(module, "module", None), torch.nn.Module) else module
        assert isinstance(inner, torch.nn.Module)
        if self.tcfg.zero_stage < 3:
            lp = fp32_head_logprobs(inner, t["input_ids"], t["position_ids"], t["targets"], t["inv_t"],
                                    HEAD_CHUNK_TOKENS, t["mask"])
            if lp is not None:
                return lp
        out = module(input_ids=t["input_ids"].unsqueeze(0), position_ids=t["position_ids"].unsqueeze(0),
                     use_cache=False)
        return token_logprobs(out.logits[0], t["targets"], t["inv_t"])

    def logprobs_and_forward_kl(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(:meth:`logprobs`, the forward KL against the reference at every position) in one pass."""
        assert self.ref_model is not None
        inner = self.ds.module if isinstance(getattr(self.ds, "module", None), torch.nn.Module) else self.ds
        assert isinstance(inner, torch.nn.Module)
        if self.tcfg.zero_stage < 3:
            both = fp32_head_logprobs_and_forward_kl(inner, self.ref_model, t["input_ids"], t["position_ids"],
                                                     t["targets"], t["inv_t"], HEAD_CHUNK_TOKENS, t["mask"])
            if both is not None:
                return both
        kw = {"input_ids": t["input_ids"].unsqueeze(0), "position_ids": t["position_ids"].unsqueeze(0),
              "use_cache": False}
        logits = self.ds(**kw).logits[0]
        with torch.no_grad():
            ref_logits = self.ref_model(**kw).logits[0]
        return token_logprobs(logits, t["targets"], t["inv_t"]), forward_kl(logits, ref_logits, t["inv_t"])

    def global_loss_tokens(self, micro_batches: list[MicroBatch]) -> float:
        local = torch.tensor([float(sum(mb.num_loss_tokens for mb in micro_batches))], device=self.device)
        tdist.all_reduce(local)
        return float(local.item())

    def train_step(self, *minibatches: list[MicroBatch]) -> StepResult:
        """One optimizer update per minibatch (this rank's micro-batches of each); stats are summed over
        ranks. The step stops at the first update the non-finite guard skips."""
        t0 = time.perf_counter()
        self.ds.train()
        tensors = [[self._tensors(mb) for mb in mbs] for mbs in minibatches]
        prox: list[list[torch.Tensor | None]] = (self._proximal(tensors) if len(tensors) > 1
                                                 else [[None] * len(ts) for ts in tensors])
        sums, before, lrs, nonfinite = LossSums(), [], [], ""
        for mbs, ts, px in zip(minibatches, tensors, prox, strict=True):
            update = self._update(mbs, ts, px)
            lrs.append(update.lr)
            if update.nonfinite:  # its sums are not finite and not the policy's: they stay out of the stats
                nonfinite = update.nonfinite
                break
            sums.add(update.sums)
            before.extend(update.before)
        updates = len(lrs) - int(bool(nonfinite))
        step_kl = None
        if self.schedule.target_kl > 0 and not nonfinite:
            step_kl, signal = self._step_kl(before)
            if signal:  # a step with no policy-gradient signal says nothing of the lr a real one can take
                self.schedule.observe(step_kl)
                apply_now(self.scheduler, self.schedule)
        return StepResult(sums=self._all_reduce_sums(sums), grad_norm=self._grad_norm(), lr=lrs[0],
                          tokens=sum(mb.num_tokens for mbs in minibatches for mb in mbs),
                          seconds=time.perf_counter() - t0, step_kl=step_kl, updates=updates, nonfinite=nonfinite)

    def _proximal(self, tensors: list[list[dict[str, torch.Tensor]]]) -> list[list[torch.Tensor | None]]:
        """The proximal policy's logprobs (the weights before the step's first update) on every micro-batch."""
        with torch.no_grad():
            return [[self.logprobs(self.ds, t) for t in ts] for ts in tensors]

    def _update(self, micro_batches: list[MicroBatch], tensors: list[dict[str, torch.Tensor]],
                prox: list[torch.Tensor | None]) -> _Update:
        """Forward/backward every micro-batch of one minibatch, then one guarded optimizer step."""
        total = self.global_loss_tokens(micro_batches)
        assert total > 0, "the planner never emits a minibatch without loss tokens"
        sums, finite = LossSums(), True
        before: list[tuple[dict[str, torch.Tensor], torch.Tensor]] = []
        for t, px in zip(tensors, prox, strict=True):
            ref, fkl = None, None
            if self._forward_kl:
                logp, fkl = self.logprobs_and_forward_kl(t)
            else:
                logp, ref = self.logprobs(self.ds, t), self._ref_logprobs(t)
            loss, s = policy_loss(logp, t["behaviour"], t["adv"], t["mask"], params=self.params, total_tokens=total,
                                  ref_logp=ref, staleness=t["staleness"], forward_kl_tokens=fkl, prox_logp=px)
            finite = finite and bool(torch.isfinite(loss))
            self.ds.backward(loss * self.world, scale_wrt_gas=False)
            sums.add(s)
            if self.schedule.target_kl > 0:
                before.append((t, logp.detach() if px is None else px))
        fault_point("step")
        lr = float(self.scheduler.get_last_lr()[0])  # the lr of this update (ds.step() sets the next one)
        return _Update(sums, lr, self._guarded_step(finite), before)

    def _guarded_step(self, loss_finite: bool) -> str:
        """``ds.step()`` under the non-finite guard; returns '' when applied, else what was not finite. A skipped
        update leaves the lr schedule where it was (DeepSpeed advances it unless it saw the overflow itself)."""
        self.guard.loss_finite, self.guard.norm_finite, self.guard.skipped = loss_finite, True, ""
        epoch = self.scheduler.last_epoch
        self.ds.step()
        norm = self.ds.get_global_grad_norm()
        skipped = self.guard.skipped or ("grad_norm" if norm is not None and not math.isfinite(float(norm)) else "")
        if skipped:
            self.scheduler.last_epoch = epoch
            apply_now(self.scheduler, self.schedule)
        return skipped

    def _step_kl(self, before: list[tuple[dict[str, torch.Tensor], torch.Tensor]]) -> tuple[float, bool]:
        """Collective: (KL(before || after this step) per loss token over the step's batch, whether any loss
        token had a non-zero advantage), on every rank (one more forward pass over the batch; see
        :mod:`train_node.trainer.lrschedule`)."""
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        with torch.no_grad():
            for t, old in before:
                totals += kl_totals(old, self.logprobs(self.ds, t), t["mask"], t["adv"]).to(totals.device)
        tdist.all_reduce(totals)
        return mean_token_kl(totals)

    @property
    def _forward_kl(self) -> bool:
        return self.ref_model is not None and self.params.kl_coef > 0 and self.params.kl_estimator == "forward"

    def _ref_logprobs(self, t: dict[str, torch.Tensor]) -> torch.Tensor | None:
        if self.ref_model is None or self.params.kl_coef <= 0:
            return None
        with torch.no_grad():
            return self.logprobs(self.ref_model, t)

    def _all_reduce_sums(self, sums: LossSums) -> LossSums:
        t = sums.as_tensor().to(self.device)
        tdist.all_reduce(t)
        return LossSums.from_tensor(t.cpu())

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Full-precision-as-trained weights on CPU, on rank 0 only (a collective under ZeRO-3). Each
        tensor is copied once: to the CPU from an accelerator, or within the CPU (a snapshot the
        background writer owns while training changes the parameters in place)."""
        if self.tcfg.zero_stage == 3:
            sd = self.ds._zero3_consolidated_16bit_state_dict()
            return _cpu_copy(sd) if self.rank == 0 else None
        if self.rank != 0:
            return None
        return _cpu_copy(self.module.state_dict())

    def save(self, save_dir: Path, client_state: dict[str, Any]) -> None:
        state = dict(client_state)
        # ds_to_universal needs this marker for ZeRO-1/2 checkpoints (2 -> 1 rank resume)
        state["universal_checkpoint_info"] = {"universal_checkpoint_version": 0.2}
        self.ds.save_checkpoint(str(save_dir), tag="state", client_state=state)

    def load(self, load_dir: Path, tag: str) -> dict[str, Any]:
        path, client_state = self.ds.load_checkpoint(str(load_dir), tag=tag)
        if path is None:
            raise FileNotFoundError(f"DeepSpeed found no checkpoint under {load_dir} (tag {tag})")
        # the checkpoint restores the KL controller's scale; the settings stay this run's
        self.schedule.warmup_steps, self.schedule.target_kl = self.tcfg.warmup_steps, self.tcfg.target_kl
        apply_now(self.scheduler, self.schedule)
        return dict(client_state or {})


def _cpu_copy(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One copy of every tensor, on the CPU (``.cpu().clone()`` copies an accelerator's tensor twice)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in sd.items()}
