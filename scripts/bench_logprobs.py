#!/usr/bin/env python3
"""The trainer's logprobs (forward + backward): peak memory at a long sequence and a large vocabulary, and
the time the LM head at the loss positions only saves on an agent's trajectories.

Memory (the default): compares, each in a fresh process, the full [N, V] fp32 logits (what an unchunked
head computes) with ``train_node.trainer.engine.chunked_head_logprobs`` (fp32 head applied ``--chunk``
positions at a time under activation checkpointing), on the same random hidden states and head weights.
Prints peak RSS above the inputs for each, their ratio, and the largest logprob difference (must be ~0).

    scripts/bench_logprobs.py [--tokens 4096] [--vocab 151936] [--hidden 256] [--chunk 1024]

Loss positions (``--model DIR``): the trainer's whole logprobs pass (``fp32_head_logprobs``: the decoder, the
fp32 head, the backward through the top ``--layers`` blocks and the head, as ``trainer.trainable_layers``
trains them) on one packed micro-batch of ``--tokens`` positions of which ``--loss-fraction`` carry the
loss (in runs of 64 generated tokens between context, as an agent's turns and observations alternate),
the head at every position vs at the loss positions only, alternated ``--rounds`` times in one process.
Prints the median seconds of each, their ratio, and the largest difference of the loss positions'
logprobs and of the gradients (must be ~0).

    scripts/bench_logprobs.py --model ~/.cache/spoolrl/converted/smollm2-... [--tokens 4096]
        [--loss-fraction 0.34] [--layers 4] [--rounds 3]

Packed attention (``--model DIR --sequences N``): the same pass, head at the loss positions, on ``--tokens``
positions packed as N sequences (positions restarting at each, as ``trainer.micro_batch_tokens`` packs episodes),
the attention computed through ``sdpa``'s dense block-diagonal mask vs one sequence at a time
(``train_node.trainer.attention``, what the trainer loads), alternated on the same weights. Prints the median
seconds of each, their ratio and the largest differences of logprobs and gradients (must be ~0).

    scripts/bench_logprobs.py --model ~/.cache/spoolrl/converted/smollm2-... --tokens 5440 --sequences 16
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args: argparse.Namespace) -> None:
    import torch

    from train_node.trainer.engine import chunked_head_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False)
    hidden = torch.randn(args.tokens, args.hidden, requires_grad=True)
    targets = torch.randint(0, args.vocab, (args.tokens,))
    inv_t = torch.full((args.tokens,), 1 / 0.7)
    base = _rss_mb()
    t0 = time.perf_counter()
    lp = chunked_head_logprobs(hidden, head, targets, inv_t, args.tokens if args.mode == "full" else args.chunk)
    lp.sum().backward()
    print(json.dumps({"peak_mb": _rss_mb() - base, "seconds": time.perf_counter() - t0,
                      "logprobs": lp.detach()[:64].tolist()}))


def _model_pass(args: argparse.Namespace, sequences: int) -> tuple[Any, Callable[..., tuple[float, Any, list[Any]]], Any]:
    """SmolLM2-sized setup shared by both ``--model`` comparisons: the model with its top ``--layers`` blocks
    trainable, one packed micro-batch of ``--tokens`` positions as ``sequences`` sequences (positions restarting at
    each), and ``one(masked)``, the trainer's logprobs + backward on it (the head at the loss positions only when
    ``masked``), returning (seconds, logprobs, gradients)."""
    import torch
    from transformers import AutoModelForCausalLM

    from train_node.trainer.engine import HEAD_CHUNK_TOKENS, fp32_head_logprobs
    from train_node.trainer.layers import train_top_layers

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    train_top_layers(model, args.layers)
    vocab = model.get_output_embeddings().weight.shape[0]
    n = args.tokens
    ids = torch.randint(3, vocab, (n,))
    pos = torch.arange(n) % -(-n // sequences)
    targets, inv_t = torch.roll(ids, -1), torch.full((n,), 1 / 0.7)
    period = round(64 / args.loss_fraction)  # 64 generated tokens, then context, over and over
    mask = ((torch.arange(n) % period) >= period - 64).float()
    params = [p for p in model.parameters() if p.requires_grad]

    def one(masked: bool) -> tuple[float, Any, list[Any]]:
        model.zero_grad()
        t0 = time.perf_counter()
        lp = fp32_head_logprobs(model, ids, pos, targets, inv_t, HEAD_CHUNK_TOKENS, mask if masked else None)
        assert lp is not None, "the model does not split into a decoder and a linear head"
        (lp * mask).sum().backward()
        grads = []
        for p in params:
            assert p.grad is not None, "a trainable parameter got no gradient"
            grads.append(p.grad.clone())
        return time.perf_counter() - t0, lp.detach(), grads

    return model, one, mask


def _alternate(rounds: int, variants: dict[str, Callable[[], tuple[float, Any, list[Any]]]], mask: Any
               ) -> tuple[dict[str, list[float]], float, float]:
    """Each variant ``rounds`` times, alternated; (seconds by variant, max |logprob difference| at the loss positions
    and max |gradient difference| between the two variants' last runs)."""
    seconds: dict[str, list[float]] = {k: [] for k in variants}
    last = {}
    for _ in range(rounds):
        for name, run in variants.items():
            s, lp, grads = run()
            seconds[name].append(s)
            last[name] = (lp, grads)
    (lp_a, g_a), (lp_b, g_b) = last.values()
    on = mask > 0
    lp_diff = float((lp_a[on] - lp_b[on]).abs().max())
    grad_diff = max(float((a - b).abs().max()) for a, b in zip(g_a, g_b, strict=True))
    return seconds, lp_diff, grad_diff


def _report(args: argparse.Namespace, title: str, seconds: dict[str, list[float]], lp_diff: float, grad_diff: float,
            record: dict[str, Any]) -> None:
    import statistics

    print(f"{title}, {args.model}, top {args.layers} blocks trained, median of {args.rounds}")
    (name_a, a), (name_b, b) = ((k, statistics.median(v)) for k, v in seconds.items())
    for name in seconds:
        print(f"  {name:32s} {statistics.median(seconds[name]):6.2f} s   {[round(x, 2) for x in seconds[name]]}")
    print(f"  ratio {a / b:.2f}x   max |logprob difference| {lp_diff:.2e}   max |gradient difference| {grad_diff:.2e}")
    print(json.dumps({**record, "tokens": args.tokens, f"{name_a}_s": round(a, 3), f"{name_b}_s": round(b, 3),
                      "ratio": round(a / b, 3), "logprob_diff": lp_diff, "grad_diff": grad_diff}))


def head_at_loss_positions(args: argparse.Namespace) -> None:
    """``--model``: the head at every position vs at the loss positions only, alternated in one process."""
    _, one, mask = _model_pass(args, 1)
    seconds, lp_diff, grad_diff = _alternate(args.rounds, {"every": lambda: one(False), "loss_only": lambda: one(True)},
                                             mask)
    _report(args, f"trainer logprobs + backward, {args.tokens} positions ({int(mask.sum())} loss, "
            f"{args.loss_fraction:.0%}), head at every position vs at the loss positions only", seconds, lp_diff,
            grad_diff, {"bench": "logprobs_loss_positions", "loss_tokens": int(mask.sum())})


def packed_attention(args: argparse.Namespace) -> None:
    """``--model --sequences N``: a micro-batch of N packed sequences, its attention through sdpa's block-diagonal
    mask vs one sequence at a time (what the trainer loads), alternated in one process on the same weights."""
    from train_node.trainer.attention import register

    model, one, mask = _model_pass(args, args.sequences)
    packed = register()

    def run(attention: str) -> tuple[float, Any, list[Any]]:
        model.set_attn_implementation(attention)
        return one(True)

    seconds, lp_diff, grad_diff = _alternate(args.rounds, {"sdpa_mask": lambda: run("sdpa"),
                                                           "per_sequence": lambda: run(packed)}, mask)
    _report(args, f"trainer logprobs + backward, {args.tokens} positions packed as {args.sequences} sequences, "
            f"attention with sdpa's block-diagonal mask vs per sequence", seconds, lp_diff, grad_diff,
            {"bench": "logprobs_packed_attention", "sequences": args.sequences})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--model", help="a model directory: measure the head at the loss positions only instead")
    ap.add_argument("--loss-fraction", type=float, default=0.34,
                    help="with --model: share of positions that carry the loss (default 0.34: 1,825 of 5,420 in "
                    "the lookup episodes of bench_learning_real)")
    ap.add_argument("--layers", type=int, default=4, help="with --model: trainer.trainable_layers (default 4)")
    ap.add_argument("--rounds", type=int, default=3, help="with --model: alternated measurements (default 3)")
    ap.add_argument("--sequences", type=int,
                    help="with --model: pack --tokens as this many sequences and compare the attention through "
                    "sdpa's block-diagonal mask with the trainer's per-sequence attention instead")
    ap.add_argument("--mode", choices=["full", "chunked"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model:
        if not 0 < args.loss_fraction <= 1:
            ap.error(f"--loss-fraction must be in (0, 1], not {args.loss_fraction}")
        if args.sequences is not None:
            if not 1 <= args.sequences <= args.tokens:
                ap.error(f"--sequences must be between 1 and --tokens ({args.tokens}), not {args.sequences}")
            return packed_attention(args)
        return head_at_loss_positions(args)
    if args.mode:
        return worker(args)
    out = {}
    for mode in ("full", "chunked"):
        cmd = [sys.executable, __file__, "--mode", mode, *(f"--{k}={getattr(args, k)}" for k in
                                                          ("tokens", "vocab", "hidden", "chunk"))]
        out[mode] = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
    diff = max(abs(a - b) for a, b in zip(out["full"]["logprobs"], out["chunked"]["logprobs"], strict=True))
    print(f"logprobs + backward, {args.tokens} tokens x {args.vocab} vocab (fp32 head, hidden {args.hidden})")
    for mode in ("full", "chunked"):
        print(f"  {mode:8s} peak {out[mode]['peak_mb']:8.0f} MB above inputs   {out[mode]['seconds']:6.1f} s")
    print(f"  ratio full/chunked peak: {out['full']['peak_mb'] / max(out['chunked']['peak_mb'], 1):.1f}x   "
          f"max |logprob difference| {diff:.2e}")


if __name__ == "__main__":
    main()
