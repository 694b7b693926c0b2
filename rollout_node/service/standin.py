"""A stand-in LLM backend for tests and benchmarks: the ``/v1/completions`` subset rollout nodes
speak (token-ID prompt in; ``token_ids``, ``logprobs.token_logprobs``, ``weight_versions`` out) with
a fixed latency, answering a scripted reply, and recording what it received and produced.

``python -m rollout_node.service.standin --tokenizer DIR [--reply TEXT] [--latency-s S] [--port P]
[--ready-file F] [--record F]``. The reply is encoded once with DIR's tokenizer; every completion
returns its first ``max_tokens`` IDs, each with logprob -0.5 (``logprobs_mode: processed_logprobs``).
With ``--record``, one JSON line per completion: ``{"prompt": [...], "token_ids": [...]}``.
Not a model: no sampling, no batching; it only stands in for one so the plumbing can be measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
from pathlib import Path

from aiohttp import web

from hpc.httpserver import HttpServer

SUBMIT = '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call><|im_end|>'
VERSION = 1


class StandIn:
    def __init__(self, reply_ids: list[int], latency_s: float, record: Path | None, max_model_len: int) -> None:
        self.reply_ids, self.latency_s, self.max_model_len = reply_ids, latency_s, max_model_len
        self.record = open(record, "a") if record else None  # noqa: SIM115 - lives as long as the server
        self.completions = 0

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "standin", "max_model_len": self.max_model_len}]})

    async def complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = [int(i) for i in body["prompt"]]
        ids = self.reply_ids[: max(1, int(body.get("max_tokens", 16)))]
        await asyncio.sleep(self.latency_s)
        self.completions += 1
        if self.record is not None:
            self.record.write(json.dumps({"prompt": prompt, "token_ids": ids}) + "\n")
            self.record.flush()
        choice = {"index": 0, "text": "", "token_ids": ids, "prompt_token_ids": prompt,
                  "logprobs": {"token_logprobs": [-0.5] * len(ids)}, "finish_reason": "stop",
                  "logprobs_mode": "processed_logprobs",
                  "weight_versions": [{"version": VERSION, "start": 0, "end": len(ids)}]}
        return web.json_response({"id": f"cmpl-{self.completions}", "object": "text_completion",
                                  "model": "standin", "choices": [choice]})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.add_routes([web.get("/v1/models", self.models), web.post("/v1/completions", self.complete),
                        web.get("/health", self.models)])
        return app


def encode_reply(tokenizer_dir: str, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return list(Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")).encode(text, add_special_tokens=False).ids)


def _serve(args: argparse.Namespace) -> None:
    standin = StandIn(encode_reply(args.tokenizer, args.reply), args.latency_s,
                      Path(args.record) if args.record else None, args.max_model_len)
    server = HttpServer(standin.app(), host="127.0.0.1", port=args.port, backlog=4096).start()
    if args.ready_file:
        tmp = f"{args.ready_file}.tmp"
        Path(tmp).write_text(json.dumps({"url": server.url}))
        os.replace(tmp, args.ready_file)
    threading.Event().wait()  # serves until the process is signalled


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokenizer", required=True, help="HF model directory holding tokenizer.json")
    p.add_argument("--reply", default=SUBMIT)
    p.add_argument("--latency-s", type=float, default=0.0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ready-file", default="")
    p.add_argument("--record", default="")
    p.add_argument("--max-model-len", type=int, default=32768)
    _serve(p.parse_args())


if __name__ == "__main__":
    main()
