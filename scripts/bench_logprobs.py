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
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


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


def head_at_loss_positions(args: argparse.Namespace) -> None:
    """``--model``: the head at every position vs at the loss positions only, alternated in one process."""
    import statistics

    import torch
    from transformers import AutoModelForCausalLM

    from train_node.trainer.engine import HEAD_CHUNK_TOKENS, fp32_head_logprobs
    from train_node.trainer.layers import train_top_layers

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    train_top_layers(model, args.layers)
    vocab = model.get_output_embeddings().weight.shape[0]
    n = args.tokens
    ids = torch.randint(3, vocab, (n,))
    pos, targets, inv_t = torch.arange(n), torch.roll(ids, -1), torch.full((n,), 1 / 0.7)
    period = round(64 / args.loss_fraction)  # 64 generated tokens, then context, over and over
    mask = ((torch.arange(n) % period) >= period - 64).float()
    params = [p for p in model.parameters() if p.requires_grad]

    def one(masked: bool) -> tuple[float, torch.Tensor, list[torch.Tensor]]:
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

    seconds: dict[bool, list[float]] = {False: [], True: []}
    last: dict[bool, tuple[torch.Tensor, list[torch.Tensor]]] = {}
    for _ in range(args.rounds):
        for masked in (False, True):
            s, lp, grads = one(masked)
            seconds[masked].append(s)
            last[masked] = (lp, grads)
    on = mask > 0
    lp_diff = float((last[False][0][on] - last[True][0][on]).abs().max())
    grad_diff = max(float((a - b).abs().max()) for a, b in zip(last[False][1], last[True][1], strict=True))
    every, loss_only = statistics.median(seconds[False]), statistics.median(seconds[True])
    print(f"trainer logprobs + backward, {n} positions ({int(mask.sum())} loss, {args.loss_fraction:.0%}), "
          f"{args.model} (vocab {vocab}), top {args.layers} blocks trained, median of {args.rounds}")
    print(f"  head at every position  {every:6.2f} s   {[round(x, 2) for x in seconds[False]]}")
    print(f"  head at loss positions  {loss_only:6.2f} s   {[round(x, 2) for x in seconds[True]]}")
    print(f"  ratio {every / loss_only:.2f}x   max |logprob difference| {lp_diff:.2e}   "
          f"max |gradient difference| {grad_diff:.2e}")
    print(json.dumps({"bench": "logprobs_loss_positions", "tokens": n, "loss_tokens": int(mask.sum()),
                      "every_s": round(every, 3), "loss_only_s": round(loss_only, 3),
                      "ratio": round(every / loss_only, 3), "logprob_diff": lp_diff, "grad_diff": grad_diff}))


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
    ap.add_argument("--mode", choices=["full", "chunked"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model:
        if not 0 < args.loss_fraction <= 1:
            ap.error(f"--loss-fraction must be in (0, 1], not {args.loss_fraction}")
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
