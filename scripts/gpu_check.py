#!/usr/bin/env python3
"""GPU check of the trainer (run by scripts/gpu_check.sh): bf16 ZeRO-2 and ZeRO-3 on one GPU with NCCL.

For each stage: tokens/s and peak memory over timed steps; HF export through the Publisher (reloaded
with transformers, weights compared); logprobs of a transformers generation (from the exported
policy) against the trainer's packed forward pass; checkpoint save, then the next-step loss of the
engine vs a fresh engine restored from the checkpoint. ``--cpu``: the same on a tiny model with gloo
and fp32 (a dry run for machines without a GPU). Prints ``RESULT {json}`` and writes it to
``--out/gpu_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

if TYPE_CHECKING:
    from hpc.config import AlgorithmConfig, TrainerConfig
    from hpc.paths import RunPaths
    from train_node.trainer.engine import Engine


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cpu", action="store_true", help="tiny model, gloo, fp32: a dry run without a GPU")
    ap.add_argument("--out", default=".")
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="timed steps per stage")
    ap.add_argument("--seq", type=int, default=None, help="max tokens per sample")
    ap.add_argument("--stages", default="2,3")
    a = ap.parse_args()
    gpu = {"hidden": 1024, "layers": 12, "vocab": 32000, "steps": 8, "seq": 2048}
    cpu = {"hidden": 64, "layers": 2, "vocab": 300, "steps": 3, "seq": 64}
    for k, v in (cpu if a.cpu else gpu).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    return a


def build_model_dir(path: Path, a: argparse.Namespace) -> None:
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    heads = max(4, a.hidden // 128)
    cfg = Qwen2Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=int(a.hidden * 2.75) // 64 * 64,
                      num_hidden_layers=a.layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                      max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(str(path))


def samples(step: int, a: argparse.Namespace, n: int = 8) -> list[Any]:
    from train_node.trainer.packing import Sample

    rng = np.random.default_rng(step)
    out = []
    for i in range(n):
        length = int(rng.integers(a.seq // 4, a.seq + 1))
        mask = np.zeros(length, dtype=np.int8)
        mask[length // 4:] = 1
        lp = np.where(mask == 1, -rng.uniform(5, 9, length), 0).astype(np.float32)
        out.append(Sample(f"s{step}-{i}", rng.integers(3, a.vocab, length).astype(np.int32), mask, lp,
                          float(rng.normal()), 1.0))
    return out


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def make_engine(model_dir: Path, tcfg: TrainerConfig, acfg: AlgorithmConfig, *, zero_out: bool = False) -> Engine:
    from train_node.trainer.engine import Engine, load_model

    model = load_model(model_dir, tcfg.precision, False)
    if zero_out:  # a fresh engine whose weights must come back from the checkpoint alone
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
    return Engine(model, tcfg, acfg)


def step(engine: Engine, s: list[Any], mbt: int) -> Any:
    from train_node.trainer.packing import plan_step

    plan = plan_step(s, 1, mbt)
    return engine.train_step(plan.per_rank[0]), plan


def logprob_check(engine: Engine, policy_dir: Path, a: argparse.Namespace, dtype: torch.dtype) -> dict[str, float]:
    """Raw logprobs recorded by transformers' generate vs the trainer's packed forward on the same ids."""
    from transformers import AutoModelForCausalLM

    from train_node.trainer.packing import Sample, build_micro_batch

    hf = AutoModelForCausalLM.from_pretrained(str(policy_dir), dtype=dtype).to(engine.device).eval()
    torch.manual_seed(1)
    prompts = torch.randint(3, a.vocab, (4, 16), device=engine.device)
    with torch.no_grad():
        out = hf.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_k=0,
                          top_p=1.0, temperature=1.0, max_new_tokens=min(64, a.seq), output_logits=True,
                          return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
    gen = out.sequences[:, prompts.shape[1]:]
    lp = torch.stack([torch.log_softmax(x.float(), -1) for x in out.logits], 1).gather(-1, gen[..., None])[..., 0]
    ss = []
    for i in range(len(gen)):
        ids = out.sequences[i].cpu().numpy().astype(np.int32)
        mask = np.r_[np.zeros(prompts.shape[1]), np.ones(gen.shape[1])].astype(np.int8)
        ss.append(Sample(f"g{i}", ids, mask, np.r_[np.zeros(prompts.shape[1]), lp[i].cpu().numpy()].astype(np.float32),
                         0.0, 1.0))
    mb = build_micro_batch(ss)
    with torch.no_grad():
        mine = engine.logprobs(engine.ds, engine._tensors(mb))
    m = torch.from_numpy(mb.mask).to(mine.device) > 0
    diff = (mine[m].float() - torch.from_numpy(mb.behaviour_logprobs).to(mine.device)[m]).abs()
    del hf
    return {"logprob_max_abs": float(diff.max()), "logprob_mean_abs": float(diff.mean()), "tokens": int(m.sum())}


def export_check(engine: Engine, paths: RunPaths, model_dir: Path, dtype: torch.dtype) -> tuple[dict[str, Any], Path]:
    from transformers import AutoConfig, AutoModelForCausalLM

    from train_node.trainer.publish import Publisher

    t0 = time.perf_counter()
    sd = engine.full_state_dict()
    assert sd is not None, "a single process is rank 0: it holds the full state dict"
    copy_s = time.perf_counter() - t0
    pub = Publisher(paths, AutoConfig.from_pretrained(str(model_dir)), None, keep=2, background=False)
    stats = pub.publish(sd, copy_s=copy_s)
    target = paths.policy_version(stats.version)
    loaded = AutoModelForCausalLM.from_pretrained(str(target), dtype=dtype).state_dict()
    mismatched = [k for k, v in sd.items() if not torch.equal(loaded[k].to(v.dtype), v)]
    size_gb = sum(f.stat().st_size for f in target.iterdir()) / 1e9
    return {"copy_s": round(copy_s, 3), "write_s": round(stats.write_s, 3), "size_gb": round(size_gb, 3),
            "tensors": len(sd), "mismatched": mismatched[:5]}, target


def run_stage(stage: int, model_dir: Path, work: Path, a: argparse.Namespace) -> dict[str, Any]:
    from hpc.config import config_from_dict
    from hpc.paths import RunPaths
    from train_node.trainer import checkpoint as ckpt

    precision = "fp32" if a.cpu else "bf16"
    cfg = config_from_dict({"trainer": {"zero_stage": stage, "precision": precision, "lr": 1e-5, "grad_clip": 1.0,
                                        "micro_batch_tokens": 4 * a.seq},
                            "slurm": {"train": {"gpus_per_node": 0 if a.cpu else 1}}})
    dtype = torch.float32 if a.cpu else torch.bfloat16
    res: dict[str, Any] = {"stage": stage, "precision": precision}
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    engine = make_engine(model_dir, cfg.trainer, cfg.algorithm)
    res["init_s"] = round(time.perf_counter() - t0, 2)
    step(engine, samples(0, a), cfg.trainer.micro_batch_tokens)  # warm-up
    sync()
    t0, tokens, times = time.perf_counter(), 0, []
    for i in range(1, a.steps + 1):
        ts = time.perf_counter()
        r, plan = step(engine, samples(i, a), cfg.trainer.micro_batch_tokens)
        sync()
        times.append(time.perf_counter() - ts)
        tokens += plan.total_tokens
    wall = time.perf_counter() - t0
    res.update(tokens_per_s=round(tokens / wall, 1), step_s_median=round(sorted(times)[len(times) // 2], 4),
               last_loss=r.sums.loss / max(r.sums.tokens, 1), grad_norm=r.grad_norm,
               micro_batches=len(plan.per_rank[0]), packing_efficiency=round(plan.packing_efficiency, 3))
    if torch.cuda.is_available():
        res["peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    paths = RunPaths(work / f"run_s{stage}")
    paths.checkpoints.mkdir(parents=True, exist_ok=True)
    res["export"], policy_dir = export_check(engine, paths, model_dir, dtype)
    res.update(logprob_check(engine, policy_dir, a, dtype))
    t0 = time.perf_counter()
    meta = ckpt.CheckpointMeta(step=a.steps + 1, parent=None, shards=[], trainer_state=ckpt.TrainerState(consumer={}))
    tag = ckpt.save(engine, paths, a.steps + 1, meta, [])
    res["checkpoint_s"] = round(time.perf_counter() - t0, 2)
    nxt = samples(10_000, a)
    before = step(engine, nxt, cfg.trainer.micro_batch_tokens)[0].sums.loss
    del engine
    fresh = make_engine(model_dir, cfg.trainer, cfg.algorithm, zero_out=True)
    ckpt.load(fresh, paths, tag, universal=False)
    after = step(fresh, nxt, cfg.trainer.micro_batch_tokens)[0].sums.loss
    res.update(resume_loss=before, resumed_loss=after, resume_abs_diff=abs(before - after))
    del fresh
    shutil.rmtree(paths.root, ignore_errors=True)
    return res


def main() -> None:
    a = parse()
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if a.cpu else "cuda")
    if a.cpu:
        torch.set_num_threads(1)
    from train_node.trainer.dist_env import DistEnv
    from train_node.trainer.engine import init_distributed

    result: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available(),
                              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    import deepspeed
    import transformers

    result.update(deepspeed=deepspeed.__version__, transformers=transformers.__version__, python=sys.version.split()[0])
    result["backend"] = init_distributed(DistEnv(0, 0, 1, "127.0.0.1", 29400 + os.getpid() % 500, "single"))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        build_model_dir(work / "model", a)
        result["model_build_s"] = round(time.perf_counter() - t0, 1)
        result["params_m"] = round(sum(p.numel() for p in __import__("safetensors.torch", fromlist=["x"])
                                       .load_file(str(work / "model" / "model.safetensors")).values()) / 1e6, 1)
        result["stages"] = []
        for stage in (int(s) for s in a.stages.split(",")):
            try:
                result["stages"].append(run_stage(stage, work / "model", work, a))
            except Exception as exc:  # noqa: BLE001 - report and go on to the next stage
                result["stages"].append({"stage": stage, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
            print("STAGE " + json.dumps(result["stages"][-1], default=str), flush=True)
    text = json.dumps(result, default=str)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "gpu_check.json").write_text(text + "\n")
    print("RESULT " + text, flush=True)


if __name__ == "__main__":
    main()
