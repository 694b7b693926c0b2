"""The HTTP API subset both engines speak: vLLM's ``/v1/completions`` with token-ID prompts.

Guarantees (torch-free, pure functions):
- :func:`parse_completion_request` accepts exactly the fields listed in :data:`KNOWN_FIELDS`
  (unknown ones are ignored like vLLM's extra fields, unsupported features are a
  :class:`BadRequest`), with vLLM's defaults (``max_tokens`` 16, ``temperature`` 1, ``n`` 1).
- Prompts are token IDs only (a list of ints, or a list of such lists); text prompts are refused,
  because re-tokenizing on the server would break the token-in/token-out invariant.
- :func:`choice_json` builds one choice in vLLM's shape: ``token_ids``, ``prompt_token_ids``,
  ``logprobs.token_logprobs`` (PROCESSED: the sampled token's log-probability under the distribution
  it was drawn from, temperature / top-k / top-p applied; named in ``logprobs_mode``),
  ``finish_reason`` ('stop' or 'length'), ``stop_reason`` and ``weight_versions`` spans
  ``[{"version": int, "start": i, "end": j}]`` over the generated tokens (end exclusive).
- Choices are ordered prompt-major: choice ``p * n + k`` is sample ``k`` of prompt ``p``; with a
  ``seed``, sample ``k`` uses ``seed + k`` (vLLM's rule for ``n > 1``).
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from typing import Any

MAX_LOGPROBS = 20
# What both engines report in ``token_logprobs`` (vLLM: ``--logprobs-mode processed_logprobs``); every
# choice carries it as ``logprobs_mode`` so a client can record what kind of number it holds.
LOGPROBS_MODE = "processed_logprobs"
KNOWN_FIELDS = frozenset({
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "n", "logprobs",
    "stop_token_ids", "ignore_eos", "min_tokens", "return_token_ids", "return_tokens_as_token_ids",
    "stream", "echo", "stop", "user", "return_weight_versions", "skip_special_tokens",
})


class BadRequest(Exception):
    """A request the API cannot serve; becomes an HTTP error in vLLM's error shape."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-choice sampling settings (validated)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompts: tuple[tuple[int, ...], ...]
    n: int
    params: SamplingParams
    return_token_ids: bool
    tokens_as_ids: bool

    def choice_params(self, k: int) -> SamplingParams:
        """Sampling params of sample ``k`` (0-based) of each prompt."""
        if self.params.seed is None or k == 0:
            return self.params
        return dataclasses.replace(self.params, seed=self.params.seed + k)


def error_json(message: str, status: int) -> dict[str, Any]:
    """vLLM's error body."""
    kind = {400: "BadRequestError", 401: "Unauthorized", 404: "NotFoundError", 503: "ServiceUnavailable"}
    return {"error": {"message": message, "type": kind.get(status, "InternalServerError"), "param": None,
                      "code": status}}


def _int(body: dict[str, Any], key: str, default: int | None, lo: int | None = None) -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{key} must be an integer, got {value!r}")
    if lo is not None and value < lo:
        raise BadRequest(f"{key} must be at least {lo}, got {value}")
    return value


def _float(body: dict[str, Any], key: str, default: float, lo: float, hi: float | None = None) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise BadRequest(f"{key} must be a number, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise BadRequest(f"{key} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value}")
    return float(value)


def _token_list(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise BadRequest(f"{what} must be a list of token IDs (ints); text prompts are not supported")
    if any(t < 0 for t in value):
        raise BadRequest(f"{what} holds a negative token ID")
    return tuple(value)


def parse_prompts(value: Any) -> tuple[tuple[int, ...], ...]:
    if isinstance(value, list) and value and all(isinstance(p, list) for p in value):
        prompts = tuple(_token_list(p, f"prompt[{i}]") for i, p in enumerate(value))
    else:
        prompts = (_token_list(value, "prompt"),)
    if any(not p for p in prompts):
        raise BadRequest("prompt must hold at least one token ID")
    return prompts


def parse_completion_request(body: Any) -> CompletionRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if body.get("stream"):
        raise BadRequest("stream=true is not supported by this engine")
    if body.get("echo"):
        raise BadRequest("echo=true is not supported by this engine")
    if body.get("stop"):
        raise BadRequest("'stop' strings are not supported; use stop_token_ids")
    if "prompt" not in body:
        raise BadRequest("prompt is required")
    logprobs = _int(body, "logprobs", None, 0)
    if logprobs is not None and logprobs > MAX_LOGPROBS:
        raise BadRequest(f"logprobs must be at most {MAX_LOGPROBS}, got {logprobs}")
    stop_ids = body.get("stop_token_ids") or []
    params = SamplingParams(
        max_tokens=_int(body, "max_tokens", 16, 1) or 16,
        temperature=_float(body, "temperature", 1.0, 0.0),
        top_p=_float(body, "top_p", 1.0, 1e-9, 1.0),
        top_k=_int(body, "top_k", -1, -1) or -1,
        seed=_int(body, "seed", None),
        stop_token_ids=_token_list(stop_ids, "stop_token_ids"),
        ignore_eos=bool(body.get("ignore_eos", False)),
        min_tokens=_int(body, "min_tokens", 0, 0) or 0,
        logprobs=logprobs,
    )
    model = body.get("model")
    return CompletionRequest(
        model=model if isinstance(model, str) else None,
        prompts=parse_prompts(body["prompt"]),
        n=_int(body, "n", 1, 1) or 1,
        params=params,
        return_token_ids=bool(body.get("return_token_ids", False)),
        tokens_as_ids=bool(body.get("return_tokens_as_token_ids", False)),
    )


def spans_json(spans: list[list[int]]) -> list[dict[str, int]]:
    return [{"version": v, "start": s, "end": e} for v, s, e in spans]


@dataclasses.dataclass
class ChoiceResult:
    """What an engine produced for one choice."""

    prompt: tuple[int, ...]
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[dict[int, float]]
    spans: list[list[int]]
    finish_reason: str
    stop_reason: int | None


def choice_json(index: int, res: ChoiceResult, req: CompletionRequest, text: str,
                token_text: list[str]) -> dict[str, Any]:
    """One choice in vLLM's shape (``token_text``: the per-token strings for ``logprobs.tokens``)."""
    if req.tokens_as_ids:
        token_text = [f"token_id:{t}" for t in res.token_ids]
    return {
        "index": index,
        "text": text,
        "logprobs": None if req.params.logprobs is None else _logprobs_json(res, token_text),
        "finish_reason": res.finish_reason,
        "stop_reason": res.stop_reason,
        "token_ids": list(res.token_ids) if req.return_token_ids else None,
        "prompt_token_ids": list(res.prompt) if req.return_token_ids else None,
        "prompt_logprobs": None,
        "weight_versions": spans_json(res.spans),
        "logprobs_mode": LOGPROBS_MODE,
    }


def _logprobs_json(res: ChoiceResult, token_text: list[str]) -> dict[str, Any]:
    offsets, pos = [], 0
    for text in token_text:
        offsets.append(pos)
        pos += len(text)
    top = [{(token_text[i] if t == res.token_ids[i] else f"token_id:{t}"): lp for t, lp in row.items()}
           for i, row in enumerate(res.top_logprobs)]
    return {"text_offset": offsets, "token_logprobs": list(res.logprobs), "tokens": token_text, "top_logprobs": top}


def response_json(model: str, choices: list[dict[str, Any]], prompt_tokens: int,
                  completion_tokens: int) -> dict[str, Any]:
    return {
        "id": f"cmpl-{secrets.token_hex(12)}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }
