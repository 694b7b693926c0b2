"""Verbs of the inference role: ``serve``, ``tiny-model``, ``infer-node``.

Imports stay light at module level (no torch): handlers import what they need.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from hpc.cli.util import add_run_arg, print_json, stdout_to_stderr
from hpc.config.inference import CPU_MAX_BATCH, CPU_PREFIX_CACHE_MB


def register(sub: Any) -> None:
    _register_serve(sub)
    _register_tiny(sub)
    _register_node(sub)


def _register_serve(sub: Any) -> None:
    p = sub.add_parser(
        "serve", help="serve a model with the lightweight CPU engine (vLLM's /v1/completions subset)",
        description="Serve an HF checkpoint dir over HTTP with the transformers CPU engine: token-ID prompts in, "
        "token IDs + processed logprobs (temperature applied) + weight-version spans out. /health is 503 until the model is loaded.")
    p.add_argument("--model", required=True, metavar="DIR", help="HF checkpoint directory (safetensors + tokenizer)")
    p.add_argument("--port", type=int, default=0, help="TCP port (0 = any free port; see --ready-file)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--uds", metavar="PATH", help="listen on this Unix socket instead of TCP")
    p.add_argument("--version", type=int, default=0, help="policy version of the initial weights")
    p.add_argument("--served-model-name", default="policy", help="model name in requests/responses")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--max-batch", type=int, default=CPU_MAX_BATCH,
                   help=f"most sequences decoded together (default {CPU_MAX_BATCH})")
    p.add_argument("--prefix-cache-mb", type=int, default=CPU_PREFIX_CACHE_MB, metavar="MIB",
                   help="MiB of KV kept from finished requests and reused by prompts that start with the same "
                   f"tokens (an agent's next turn); emptied at every reload (default {CPU_PREFIX_CACHE_MB}; 0 = off)")
    p.add_argument("--max-model-len", type=int, default=0, help="context limit (0 = max_position_embeddings)")
    p.add_argument("--secret-file", metavar="FILE", help="bearer secret for /reload (else $SPOOLRL_SECRET)")
    p.add_argument("--require-auth-all", action="store_true", help="require the secret on every route but /health")
    p.add_argument("--ready-file", metavar="FILE", help="written (JSON: url, pid) once the model is loaded")
    p.set_defaults(func=_serve)


def _register_tiny(sub: Any) -> None:
    p = sub.add_parser(
        "tiny-model", help="build a tiny random Qwen2 + locally trained BPE tokenizer (HF format)",
        description="Build a tiny causal LM from config (random init from --seed, untied embeddings) and a "
        "byte-level BPE tokenizer trained on this interpreter's stdlib sources. Nothing is downloaded. "
        "Builds are cached under $SPOOLRL_CACHE (default ~/.cache/spoolrl).")
    p.add_argument("dir", metavar="DIR", help="output directory (created; must be new or empty)")
    p.add_argument("--seed", type=int, default=0, help="weight seed (same seed = identical weights)")
    p.add_argument("--vocab-size", type=int, default=4000, help="BPE vocabulary size")
    p.set_defaults(func=_tiny)


def _register_node(sub: Any) -> None:
    p = sub.add_parser(
        "infer-node", help="run this node's inference servers for a run (what the infer het group runs)",
        description="Start the node's LLM servers (CPU engines or vLLM sized by tensor parallelism), advertise them "
        "in RUN/endpoints/, reload them live when RUN/policy/LATEST changes, restart dead ones; SIGTERM stops.")
    add_run_arg(p)
    p.add_argument("--index", type=int, default=None, help="node index in the group (default: $SLURM_NODEID or 0)")
    p.set_defaults(func=_node)


def _serve(args: argparse.Namespace) -> int:
    # Before torch loads OpenMP: spinning OpenMP workers collapse throughput when cores are shared
    # (measured on a loaded 2-core VM, 2 threads: 29-47 tok/s spinning vs 134-316 passive).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from train_node.infer.serve_main import ServeArgs, run_serve

    return run_serve(ServeArgs(
        model=args.model, port=args.port, host=args.host, uds=args.uds, version=args.version,
        served_model_name=args.served_model_name, dtype=args.dtype, threads=args.threads,
        max_batch=args.max_batch, prefix_cache_mb=args.prefix_cache_mb, max_model_len=args.max_model_len, secret_file=args.secret_file, require_auth_all=args.require_auth_all,
        ready_file=args.ready_file))


def _tiny(args: argparse.Namespace) -> int:
    from train_node.infer.tiny import MARKER, build_tiny_model

    with stdout_to_stderr():
        out = build_tiny_model(args.dir, seed=args.seed, vocab_size=args.vocab_size)
    info = json.loads((out / MARKER).read_text())
    print_json({"dir": str(out), "params": info["params"], **info["spec"]})
    return 0


def _node(args: argparse.Namespace) -> int:
    from train_node.infer.node import run_infer_node

    return run_infer_node(args.run, node_index=args.index)
