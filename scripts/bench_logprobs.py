#!/usr/bin/env python3
"""Peak memory of the trainer's logprobs (forward + backward) at a long sequence and a large vocabulary.

Compares, each in a fresh process, the full [N, V] fp32 logits (what an unchunked head computes)
with ``train_node.trainer.engine.chunked_head_logprobs`` (fp32 head applied ``--chunk`` positions at a
time under activation checkpointing), on the same random hidden states and head weights. Prints
peak RSS above the inputs for each, their ratio, and the largest logprob difference (must be ~0).

    scripts/bench_logprobs.py [--tokens 4096] [--vocab 151936] [--hidden 256] [--chunk 1024]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--mode", choices=["full", "chunked"], help=argparse.SUPPRESS)
    args = ap.parse_args()
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
