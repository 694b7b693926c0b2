"""The CPU engine in-process: batching exactness, exact weight swaps between decode steps, health."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from hpc.httpserver import HttpServer
from tests.infer.infer_helpers import forward_logprobs, http
from train_node.infer.engine import Engine, PrefixCache, Sequence, load_model
from train_node.infer.httpbase import route_app
from train_node.infer.protocol import SamplingParams
from train_node.infer.server import App, ServeOptions, make_handler

TOL = 1e-4


def _seq(prompt: list[int], max_tokens: int, seed: int) -> Sequence:
    return Sequence(tuple(prompt), SamplingParams(max_tokens=max_tokens, seed=seed, ignore_eos=True, logprobs=1))


def _max_diff(model_dir: Path, seq: Sequence, lo: int = 0, hi: int | None = None) -> float:
    ref = forward_logprobs(model_dir, list(seq.prompt), seq.token_ids)
    hi = len(seq.token_ids) if hi is None else hi
    return max(abs(a - b) for a, b in zip(seq.logprobs[lo:hi], ref[lo:hi], strict=True))


class SteppedEngine(Engine):
    """The engine with a test-side hook after each of its steps (production code carries none)."""

    on_step: Any = None

    def _step(self) -> None:
        super()._step()
        if self.on_step is not None:
            self.on_step()


class StepCounter:
    """Engine hook: counts decode steps, runs ``action`` once at step ``at``."""

    def __init__(self, at: int, action: Any = None) -> None:
        self.steps, self.at, self.action = 0, at, action
        self.reached = threading.Event()

    def __call__(self) -> None:
        self.steps += 1
        if self.steps == self.at:
            if self.action is not None:
                self.action()
            self.reached.set()


def test_staggered_joins_and_leaves_are_exact(models: dict[str, Path]) -> None:
    """Sequences of different lengths join mid-flight and leave early; every logprob still matches HF."""
    engine = SteppedEngine(load_model(models["a"], 0), max_batch=8)
    hook = StepCounter(at=5)
    engine.on_step = hook
    try:
        first = [_seq([1, 2, 3], 30, 0), _seq(list(range(10, 60)), 8, 1), _seq([7] * 17, 20, 2)]
        engine.submit(first)
        assert hook.reached.wait(120)
        later = [_seq(list(range(100, 190)), 25, 3), _seq([42], 12, 4), _seq(list(range(5, 12)), 3, 5)]
        engine.submit(later)
        for s in first + later:
            assert s.done.wait(120) and s.error is None
        for s in first + later:
            assert len(s.token_ids) == s.params.max_tokens
            assert _max_diff(models["a"], s) < TOL
    finally:
        engine.close()


def test_swap_between_decode_steps_is_exact(models: dict[str, Path]) -> None:
    """A swap staged at step k: tokens [0, k) come from A, the rest from B, each matching its weights."""
    engine = SteppedEngine(load_model(models["a"], 0), max_batch=8)
    loaded_b = load_model(models["b"], 1)
    hook = StepCounter(at=7, action=lambda: engine.stage(loaded_b))
    engine.on_step = hook
    try:
        seqs = [_seq([1, 105, 230, 377], 20, 0), _seq(list(range(200, 260)), 20, 1)]
        engine.submit(seqs)
        for s in seqs:
            assert s.done.wait(120) and s.error is None
        for s in seqs:
            assert s.spans == [[0, 0, 7], [1, 7, 20]]
            assert _max_diff(models["a"], s, 0, 7) < TOL
            assert _max_diff(models["b"], s, 7, 20) < TOL
            # the check has teeth: the other weights explain these tokens badly
            assert _max_diff(models["a"], s, 7, 20) > 0.1
    finally:
        engine.close()


def _run(engine: Engine, seq: Sequence) -> Sequence:
    engine.submit([seq])
    assert seq.done.wait(120) and seq.error is None
    return seq


def test_the_prefix_cache_serves_an_agents_next_turn_exactly(models: dict[str, Path]) -> None:
    """A second turn re-sends the first turn's prompt and answer plus an observation: only the tokens after
    what the first turn forwarded are prefilled, and its logprobs still match HF's forward pass."""
    engine = Engine(load_model(models["a"], 0), max_batch=8, prefix_cache_mb=64)
    try:
        first = _run(engine, _seq(list(range(30, 90)), 12, 0))
        assert len(engine.prefix) == 1 and engine.prefilled_tokens == 60
        forwarded = 60 + 12 - 1  # the last sampled token was never forwarded
        second = _run(engine, _seq(list(first.prompt) + first.token_ids + list(range(500, 540)), 10, 1))
        assert engine.prefix.hits == 1 and engine.prefix.reused_tokens == forwarded
        assert engine.prefilled_tokens == 60 + len(second.prompt) - forwarded
        assert _max_diff(models["a"], second) < TOL
        assert len(engine.prefix) == 1  # the second turn's entry holds the first's: one entry serves both
        # a group-mate's prompt shares only the first 40 tokens: it reuses those, and is exact too
        mate = _run(engine, _seq(list(range(30, 70)) + [7] * 25, 6, 2))
        assert engine.prefix.hits == 2 and engine.prefix.reused_tokens == forwarded + 40
        assert _max_diff(models["a"], mate) < TOL
        # an unrelated prompt is prefilled whole
        before = engine.prefilled_tokens
        _run(engine, _seq(list(range(900, 950)), 4, 3))
        assert engine.prefix.hits == 2 and engine.prefilled_tokens == before + 50
    finally:
        engine.close()


class HitRecorder(SteppedEngine):
    """Records how many prefix-cache hits each continuation prefill forwarded together."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.hit_batches: list[int] = []
        super().__init__(*args, **kwargs)

    def _prefill_after(self, hits: Any) -> Any:
        self.hit_batches.append(len(hits))
        return super()._prefill_after(hits)


def test_next_turns_admitted_together_are_prefilled_in_one_forward_and_exact(models: dict[str, Path]) -> None:
    """Three agents' next turns (cached prefixes of 71, 43 and 27 tokens, then 41, 8 and 24 new ones: the first
    turn's last answer token and an observation of 40, 7 and 23) and an unrelated prompt join a running
    sequence in one admission: the three continuations go through one forward, padded inside as well as on
    the left, and every logprob still matches HF's forward pass."""
    engine = HitRecorder(load_model(models["a"], 0), max_batch=8, prefix_cache_mb=64)
    try:
        firsts = [_run(engine, _seq(list(range(30 + 100 * i, 30 + 100 * i + n)), 12, i))
                  for i, n in enumerate((60, 32, 16))]
        nexts = [_seq(list(f.prompt) + f.token_ids + list(range(500 + j, 500 + j + extra)), 10, 10 + j)
                 for j, (f, extra) in enumerate(zip(firsts, (40, 7, 23), strict=True))]
        other = _seq(list(range(900, 950)), 6, 20)
        hits, forwarded = engine.prefix.hits, engine.prefilled_tokens
        anchor = _seq([5] * 20, 30, 9)
        engine.on_step = StepCounter(at=3, action=lambda: engine.submit([*nexts, other]))  # in the engine's thread
        engine.submit([anchor])
        for s in [anchor, *nexts, other]:
            assert s.done.wait(120) and s.error is None
        assert engine.hit_batches[-1] == 3 and engine.prefix.hits == hits + 3
        reused = [len(f.prompt) + len(f.token_ids) - 1 for f in firsts]  # all the first turn forwarded
        assert engine.prefilled_tokens == forwarded + 20 + sum(
            len(s.prompt) - r for s, r in zip(nexts, reused, strict=True)) + 50
        for s in [anchor, *nexts, other]:
            assert len(s.token_ids) == s.params.max_tokens and _max_diff(models["a"], s) < TOL
        # the KV a row padded inside left in the cache is its own, column for column: a third turn reuses it
        padded = nexts[1]  # 8 new tokens beside 41: 33 pad columns between its cached and its new tokens
        reused_before = engine.prefix.reused_tokens
        third = _run(engine, _seq(list(padded.prompt) + padded.token_ids + [77] * 9, 8, 30))
        assert engine.prefix.reused_tokens - reused_before == len(padded.prompt) + len(padded.token_ids) - 1
        assert _max_diff(models["a"], third) < TOL
    finally:
        engine.close()


def test_the_prefix_cache_is_emptied_when_new_weights_serve(models: dict[str, Path]) -> None:
    """After a swap, a prompt that extends a finished one is prefilled whole by the new weights (a KV
    computed by the old weights would make the new version's logprobs wrong)."""
    engine = Engine(load_model(models["a"], 0), max_batch=8, prefix_cache_mb=64)
    try:
        first = _run(engine, _seq(list(range(30, 90)), 12, 0))
        assert len(engine.prefix) == 1
        assert engine.swap(load_model(models["b"], 1), timeout_s=60)
        assert len(engine.prefix) == 0
        second = _run(engine, _seq(list(first.prompt) + first.token_ids + list(range(500, 540)), 10, 1))
        assert engine.prefix.hits == 0
        assert second.spans == [[1, 0, 10]]
        assert _max_diff(models["b"], second) < TOL
    finally:
        engine.close()


def test_the_prefix_cache_keeps_to_its_budget_and_its_rules() -> None:
    """Least recently used out first within the byte budget; an entry a longer one extends is dropped; a common
    prefix under one block is not used; the prompt's last token is always left to forward; a prefix that ends
    inside a block is measured exactly."""
    def kv(n: int) -> list[tuple[Any, Any]]:
        import torch

        return [(torch.full((1, 2, n, 4), float(n)), torch.full((1, 2, n, 4), float(n)))]

    per_token = 2 * 2 * 4 * 4  # K and V, 2 heads x 4 dims of fp32
    cache = PrefixCache(max_bytes=100 * per_token, block=4)
    cache.put(list(range(40)), kv(40))
    cache.put(list(range(100, 150)), kv(50))
    assert len(cache) == 2 and cache.bytes == 90 * per_token
    hit = cache.longest(tuple(range(40)) + (7,))  # uses entry 1: now the most recently used
    assert hit is not None and hit[0] == 40 and hit[1][0][0].shape[2] == 40
    cache.put(list(range(200, 230)), kv(30))  # over budget: the LRU entry (range(100, 150)) goes
    assert cache.longest(tuple(range(100, 150)) + (1,)) is None
    assert len(cache) == 2 and cache.bytes == 70 * per_token
    cache.put(list(range(60)), kv(60))  # extends range(40): that entry is dropped, not kept twice
    assert len(cache) == 2 and cache.bytes == 90 * per_token
    hit = cache.longest(tuple(range(60)))  # the whole prompt is cached: its last token is still forwarded
    assert hit is not None and hit[0] == 59
    assert cache.longest((0, 1, 2, 99, 98)) is None  # 3 common tokens < one block
    hit = cache.longest(tuple(range(10)) + (99, 98, 97, 96, 95))  # 10 common tokens: 2 blocks and 2 more
    assert hit is not None and hit[0] == 10
    cache.put(list(range(500, 700)), kv(200))  # larger than the whole budget: not kept
    assert len(cache) == 2
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0 and cache.longest(tuple(range(60))) is None
    # two conversations share a system prompt; the newer one held its blocks' pointers and is evicted: the
    # older one's next turn still finds its own KV
    shared = list(range(8))
    cache.put(shared + [50] * 30, kv(38))
    cache.put(shared + [60] * 30, kv(38))
    assert cache.longest(tuple(shared + [50] * 30 + [1])) is not None  # now the most recently used
    cache.put(list(range(900, 940)), kv(40))  # over budget: the other conversation goes
    hit = cache.longest(tuple(shared + [50] * 30 + [1]))
    assert hit is not None and hit[0] == 38


def test_health_is_503_until_loaded_and_failed_reload_is_atomic(models: dict[str, Path], tmp_path: Path) -> None:
    app = App(ServeOptions(secret="s3cret"))
    srv = HttpServer(route_app(make_handler(app)), port=0).start()
    url = srv.url
    try:
        assert http(url, "/health") == (503, {"status": "loading"})
        assert http(url, "/v1/completions", {"prompt": [1, 2], "max_tokens": 2})[0] == 503
        app.load(models["a"], 0)
        assert http(url, "/health")[0] == 200
        broken = tmp_path / "broken"
        broken.mkdir()
        (broken / "config.json").write_text("{}")
        status, body = http(url, "/reload", {"path": str(broken), "version": 1}, token="s3cret")
        assert status == 500 and "still serving version 0" in body["error"]["message"]
        status, out = http(url, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4, "logprobs": 1,
                                                    "return_token_ids": True, "ignore_eos": True})
        assert status == 200 and out["choices"][0]["weight_versions"] == [{"version": 0, "start": 0, "end": 4}]
        # /health reports what the prompts cost: the 3 prompt tokens, forwarded whole (the cache is off)
        assert http(url, "/health") == (200, {"status": "ok", "prompt_tokens_forwarded": 3, "prefix_cache": {
            "entries": 0, "bytes": 0, "max_bytes": 0, "hits": 0, "reused_tokens": 0}})
    finally:
        srv.close()
        app.close()


def test_reload_refused_without_configured_secret(models: dict[str, Path]) -> None:
    app = App(ServeOptions(secret=None))
    srv = HttpServer(route_app(make_handler(app)), port=0).start()
    try:
        app.load(models["a"], 0)
        url = srv.url
        status, body = http(url, "/reload", {"path": str(models["b"]), "version": 1}, token="anything")
        assert status == 403 and app.engine is not None and app.engine.version == 0
    finally:
        srv.close()
        app.close()


def _truncated_reference(model_dir: Path, prompt: list[int], ids: list[int], top_p: float, top_k: int) -> list[float]:
    """Processed logprobs by hand from an HF forward pass: top-k, then the smallest top-p set, renormalised."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
    out = []
    for row, tok in zip(logits, ids, strict=True):
        logp = torch.log_softmax(row, -1)
        order = logp.argsort(descending=True).tolist()
        kept = order[:top_k] if top_k > 0 else order
        if top_p < 1.0:
            mass, cut = 0.0, []
            for t in kept:
                cut.append(t)
                mass += float(logp[t].exp())
                if mass >= top_p:
                    break
            kept = cut
        assert tok in kept, "a token outside the kept set was sampled"
        out.append(float(logp[tok] - torch.logsumexp(logp[kept], 0)))
    return out


@pytest.mark.parametrize("top_p,top_k", [(0.5, -1), (1.0, 5)])
def test_truncated_sampling_stays_in_the_kept_set(models: dict[str, Path], top_p: float, top_k: int) -> None:
    """Tokens come from the kept set, and their logprobs are those of the renormalised kept set
    (processed logprobs), never the raw full-softmax ones."""
    engine = Engine(load_model(models["a"], 0))
    try:
        s = Sequence((1, 2, 3), SamplingParams(max_tokens=15, seed=3, top_p=top_p, top_k=top_k, ignore_eos=True,
                                               logprobs=5))
        engine.submit([s])
        assert s.done.wait(60) and s.error is None
        ref = _truncated_reference(models["a"], [1, 2, 3], s.token_ids, top_p, top_k)
        assert max(abs(a - b) for a, b in zip(s.logprobs, ref, strict=True)) < TOL
        raw = forward_logprobs(models["a"], [1, 2, 3], s.token_ids)
        assert max(a - b for a, b in zip(s.logprobs, raw, strict=True)) > 1e-2  # renormalised, not raw
        for tok, top in zip(s.token_ids, s.top, strict=True):
            ranked = sorted(top, key=lambda t: -top[t])
            if top_k > 0:
                assert tok in ranked[:top_k] and len(top) == 5
            assert tok in top and all(v > float("-inf") for v in top.values())
    finally:
        engine.close()


def test_client_that_hangs_up_frees_its_batch_slot(models: dict[str, Path]) -> None:
    import json
    import socket
    import time

    app = App(ServeOptions())
    srv = HttpServer(route_app(make_handler(app)), port=0).start()
    try:
        app.load(models["a"], 0)
        assert app.engine is not None
        body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 1900, "ignore_eos": True}).encode()
        with socket.create_connection(("127.0.0.1", srv.port)) as conn:
            conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            deadline = time.monotonic() + 30
            while not app.engine._batch.rows and time.monotonic() < deadline:
                time.sleep(0.05)
            assert app.engine._batch.rows, "the request never started"
            (seq,) = app.engine._batch.rows
        assert seq.done.wait(120)
        assert seq.finish_reason == "abort" and len(seq.token_ids) < 1900
        deadline = time.monotonic() + 10
        while app.engine._batch.rows and time.monotonic() < deadline:  # it leaves at the end of that step
            time.sleep(0.05)
        assert not app.engine._batch.rows
    finally:
        srv.close()
        app.close()
