"""``spoolrl serve``: the CPU engine behind an aiohttp server (:mod:`train_node.infer.httpbase`'s routes on
:class:`hpc.httpserver.HttpServer`; TCP or Unix socket).

Routes: ``POST /v1/completions``, ``GET /health``, ``GET /v1/models``, ``GET /weight_info``,
``POST /reload`` ({"path": dir, "version": int}; needs ``Authorization: Bearer <secret>``).

Guarantees:
- The socket listens before the model loads; until a model is fully loaded ``/health`` and
  ``/v1/completions`` answer 503, so no request is ever answered by a half-loaded model.
- ``/reload`` loads the new checkpoint completely in the caller's thread, then stages it; the
  engine swaps it in between two decode steps and only then does ``/reload`` answer 200. A failed
  load answers an error and the old weights keep serving. Reloads are serialized.
- Without a secret (``--secret-file`` or ``$SPOOLRL_SECRET``) ``/reload`` is refused (403);
  with one, a request without the right bearer token gets 401. ``require_auth_all`` extends the
  check to every route except ``/health``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc.config.inference import CPU_MAX_BATCH, CPU_PREFIX_CACHE_MB
from train_node.infer.engine import Engine, LoadedModel, Sequence, load_model
from train_node.infer.httpbase import Call, Reply, Route, authorized, error_reply, json_reply
from train_node.infer.protocol import (
    BadRequest,
    CompletionRequest,
    choice_json,
    parse_completion_request,
    response_json,
)

OPEN_ROUTES = frozenset({"/health"})


@dataclasses.dataclass
class ServeOptions:
    served_model_name: str = "policy"
    dtype: str = "float32"
    max_batch: int = CPU_MAX_BATCH
    prefix_cache_mb: int = CPU_PREFIX_CACHE_MB
    max_model_len: int | None = None
    secret: str | None = None
    require_auth_all: bool = False
    request_timeout_s: float = 3600.0


class App:
    """The state behind the handler: the engine (None while loading) and the tokenizer."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.engine: Engine | None = None
        self.tokenizer: Any = None
        self.loaded_at = 0.0
        self._reload_lock = threading.Lock()

    # --- lifecycle -------------------------------------------------------------------------------

    def load(self, path: str | Path, version: int) -> None:
        """Initial load; the app becomes healthy only when this returns."""
        loaded = load_model(path, version, self.options.dtype)
        self.tokenizer = _load_tokenizer(path)
        self.engine = Engine(loaded, max_batch=self.options.max_batch, max_model_len=self.options.max_model_len,
                             prefix_cache_mb=self.options.prefix_cache_mb)
        self.loaded_at = time.time()

    def reload(self, path: str, version: int) -> dict[str, Any]:
        with self._reload_lock:
            assert self.engine is not None
            previous = self.engine.version
            loaded: LoadedModel = load_model(path, version, self.options.dtype)
            if not self.engine.swap(loaded, timeout_s=self.options.request_timeout_s):
                raise TimeoutError("the engine did not reach a step boundary in time")
            self.tokenizer = _load_tokenizer(path) or self.tokenizer
            self.loaded_at = time.time()
            return {"version": version, "previous_version": previous, "path": path}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

    # --- requests --------------------------------------------------------------------------------

    def complete(self, req: CompletionRequest, client_gone: Callable[[], bool] = lambda: False) -> dict[str, Any]:
        """Generate all choices; a client that hung up or a timeout cancels them (slots are freed)."""
        engine = self.engine
        assert engine is not None
        name = self.options.served_model_name
        if req.model is not None and req.model != name:
            raise BadRequest(f"The model `{req.model}` does not exist.", 404)
        for p in req.prompts:
            if len(p) >= engine.max_model_len:
                raise BadRequest(f"This model's maximum context length is {engine.max_model_len} tokens. "
                                 f"However, your prompt contains {len(p)} input tokens.")
        seqs = [Sequence(p, req.choice_params(k)) for p in req.prompts for k in range(req.n)]
        engine.submit(seqs)
        deadline = time.monotonic() + self.options.request_timeout_s
        for s in seqs:
            while not s.done.wait(0.5):
                if client_gone() or time.monotonic() > deadline:
                    for other in seqs:
                        other.cancelled = True  # free the batch slots instead of generating for nobody
                    raise TimeoutError("client went away or request_timeout_s passed")
            if s.error:
                raise RuntimeError(s.error)
        choices = [self._choice(i, s, req) for i, s in enumerate(seqs)]
        return response_json(name, choices, sum(len(p) for p in req.prompts) * req.n,
                             sum(len(s.token_ids) for s in seqs))

    def _choice(self, index: int, seq: Sequence, req: CompletionRequest) -> dict[str, Any]:
        tok = self.tokenizer
        text = tok.decode(seq.token_ids, skip_special_tokens=True) if tok is not None else ""
        pieces = [tok.decode([t]) for t in seq.token_ids] if tok is not None and req.params.logprobs is not None \
            else [f"token_id:{t}" for t in seq.token_ids]
        return choice_json(index, seq.result(), req, text, pieces)

    def models(self) -> dict[str, Any]:
        engine = self.engine
        return {"object": "list", "data": [{
            "id": self.options.served_model_name, "object": "model", "owned_by": "spoolrl",
            "root": engine.path if engine else None, "max_model_len": engine.max_model_len if engine else None,
        }]}

    def weight_info(self) -> dict[str, Any]:
        engine = self.engine
        assert engine is not None
        return {"weight_version": str(engine.version), "version": engine.version, "path": engine.path,
                "loaded_at": self.loaded_at}


def _load_tokenizer(path: str | Path) -> Any:
    if not (Path(path) / "tokenizer.json").exists() and not (Path(path) / "tokenizer_config.json").exists():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def make_handler(app: App) -> Route:
    """The server's routes (module docstring) over ``app``."""

    def route(call: Call) -> Reply:
        method, path = call.method, call.path
        if app.options.require_auth_all and path not in OPEN_ROUTES and \
                not authorized(call.headers.get("Authorization"), app.options.secret):
            return error_reply(401, "missing or wrong bearer token")
        if (method, path) == ("GET", "/health"):
            if app.engine is None:
                return json_reply(503, {"status": "loading"})
            return json_reply(200, {"status": "ok", **app.engine.counters()})
        if (method, path) == ("GET", "/v1/models"):
            return json_reply(200, app.models())
        if app.engine is None:
            return error_reply(503, "the model is still loading")
        if (method, path) == ("POST", "/v1/completions"):
            return completions(call)
        if (method, path) == ("GET", "/weight_info"):
            return json_reply(200, app.weight_info())
        if (method, path) == ("POST", "/reload"):
            return reload(call)
        return error_reply(404, f"no route {method} {path}")

    def completions(call: Call) -> Reply:
        try:
            return json_reply(200, app.complete(parse_completion_request(call.json()), call.gone))
        except BadRequest as exc:
            return error_reply(exc.status, str(exc))

    def reload(call: Call) -> Reply:
        if not app.options.secret:
            return error_reply(403, "reload is disabled: the server was started without a secret")
        if not authorized(call.headers.get("Authorization"), app.options.secret):
            return error_reply(401, "missing or wrong bearer token")
        body = call.json()
        path, version = (body or {}).get("path"), (body or {}).get("version")
        if not isinstance(path, str) or not isinstance(version, int) or isinstance(version, bool):
            return error_reply(400, 'reload needs {"path": "<checkpoint dir>", "version": <int>}')
        try:
            return json_reply(200, app.reload(path, version))
        except Exception as exc:  # the old weights keep serving
            return error_reply(500, f"reload failed, still serving version "
                                    f"{app.engine.version if app.engine else None}: {exc}")

    return route
