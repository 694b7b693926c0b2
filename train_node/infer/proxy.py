"""The authenticating reverse proxy in front of one vLLM server (torch-free), served by
:class:`hpc.httpserver.HttpServer` (aiohttp) through :func:`train_node.infer.httpbase.route_app`.

vLLM listens on a Unix socket in a private (0700) directory, so the proxy is the only way in.
The proxy serves the same API as the CPU engine:

- ``POST /v1/completions`` (open unless ``require_auth_all``): validated like the CPU engine,
  then sent to vLLM's tokens-in/tokens-out ``/inference/v1/generate`` (one call per prompt,
  concurrently) because only that endpoint reports ``weight_versions`` in vLLM 0.32; the answer
  is rebuilt in ``/v1/completions`` shape with integer versions.
- ``GET /health`` (always open): 200 only when vLLM is healthy AND the proxy is ready (the
  initial weight version is set) AND no failed reload left the weights in doubt.
- ``GET /v1/models``, ``GET /weight_info`` (open unless ``require_auth_all``).
- ``POST /reload {"path", "version"}`` (secret required): ``/pause?mode=wait`` (in-flight requests
  finish on the old weights, new ones queue) -> ``/collective_rpc reload_weights`` ->
  ``/reset_prefix_cache`` (stale KV would mix versions) -> ``/update_weight_version`` ->
  ``/resume``. If loading fails, the previous weights are reloaded before resuming; if that fails
  too, generation stays paused and ``/health`` turns 503 so the supervisor restarts the server.
- Every other path (vLLM's development endpoints) needs the secret and is forwarded verbatim.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import socket
import threading
from pathlib import Path
from typing import Any

from train_node.infer.httpbase import Call, Reply, Route, authorized, error_reply, json_reply
from train_node.infer.protocol import (
    BadRequest,
    ChoiceResult,
    CompletionRequest,
    choice_json,
    parse_completion_request,
    response_json,
)

OPEN_ROUTES = frozenset({("GET", "/health"), ("POST", "/v1/completions"), ("GET", "/v1/models"),
                         ("GET", "/weight_info")})


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class Upstream:
    """An HTTP server at ``unix:///abs/path.sock`` or ``http://host:port``; one connection per call."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.url.startswith("unix:"):
            return _UnixConnection("/" + self.url[len("unix:"):].lstrip("/"), timeout)
        hostport = self.url.split("://", 1)[-1].rstrip("/")
        return http.client.HTTPConnection(hostport, timeout=timeout)

    def call(self, method: str, path: str, body: Any = None, *, timeout: float = 30.0,
             raw: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        conn = self._connect(timeout)
        try:
            data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
            hdrs = dict(headers or {})
            if data is not None:
                hdrs.setdefault("Content-Type", "application/json")
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def json(self, method: str, path: str, body: Any = None, *, timeout: float = 30.0) -> Any:
        status, data = self.call(method, path, body, timeout=timeout)
        if status != 200:
            raise RuntimeError(f"{method} {path} -> {status}: {data[:300]!r}")
        return json.loads(data or b"null")

    def healthy(self) -> bool:
        try:
            return self.call("GET", "/health", timeout=5.0)[0] == 200
        except OSError:
            return False


class VllmProxy:
    """State of one proxy: upstream, secret, current version, readiness."""

    def __init__(self, upstream: Upstream, *, secret: str, version: int, path: str,
                 served_model_name: str = "policy", require_auth_all: bool = False,
                 request_timeout_s: float = 3600.0) -> None:
        self.upstream = upstream
        self.secret = secret
        self.version = version
        self.path = path
        self.served_model_name = served_model_name
        self.require_auth_all = require_auth_all
        self.request_timeout_s = request_timeout_s
        self.ready = False
        self.broken: str | None = None
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="proxy-gen")

    def start(self) -> None:
        """Label the loaded weights with the integer version, then accept traffic."""
        self.upstream.json("POST", "/update_weight_version", {"new_version": str(self.version)})
        self.ready = True

    def healthy(self) -> bool:
        return self.ready and self.broken is None and self.upstream.healthy()

    # --- reload ------------------------------------------------------------------------------

    def reload(self, path: str, version: int) -> dict[str, Any]:
        if not (Path(path) / "config.json").exists():
            raise ValueError(f"{path} is not an HF checkpoint directory (no config.json)")
        with self._lock:
            previous, previous_path = self.version, self.path
            up, t = self.upstream, self.request_timeout_s
            try:
                up.json("POST", "/pause?mode=wait", timeout=t)
            except Exception:
                self._resume_quietly()  # a pause that completes after our timeout must not stick
                raise
            try:
                self._load(path)
            except Exception as exc:
                self._restore(previous_path, exc)  # resumes on the old weights, or raises
                raise RuntimeError(f"reload of {path} failed, still serving version {previous}: {exc}") from exc
            up.json("POST", "/update_weight_version", {"new_version": str(version)})
            self.version, self.path = version, path
            up.json("POST", "/resume")
            return {"version": version, "previous_version": previous, "path": path}

    def _resume_quietly(self) -> None:
        try:
            self.upstream.json("POST", "/resume")
        except Exception:
            pass  # the health check will notice a server that stays unusable

    def _load(self, path: str) -> None:
        self.upstream.json("POST", "/collective_rpc", {"method": "reload_weights",
                                                       "kwargs": {"weights_path": path}},
                           timeout=self.request_timeout_s)
        self.upstream.json("POST", "/reset_prefix_cache")

    def _restore(self, previous_path: str, cause: Exception) -> None:
        try:
            self._load(previous_path)
        except Exception as exc:
            self.broken = f"weights in doubt after a failed reload ({cause}); restore failed: {exc}"
            raise RuntimeError(self.broken) from exc
        self.upstream.json("POST", "/resume")

    # --- completions -------------------------------------------------------------------------

    def complete(self, req: CompletionRequest) -> dict[str, Any]:
        if req.model is not None and req.model != self.served_model_name:
            raise BadRequest(f"The model `{req.model}` does not exist.", 404)
        futures = [self._pool.submit(self._generate, p, req) for p in req.prompts]
        outs = [out for f in futures for out in f.result()]
        choices = [choice_json(i, res, req, text, pieces) for i, (res, text, pieces) in enumerate(outs)]
        return response_json(self.served_model_name, choices, sum(len(p) for p in req.prompts) * req.n,
                             sum(len(res.token_ids) for res, _, _ in outs))

    def _generate(self, prompt: tuple[int, ...], req: CompletionRequest) -> list[tuple[ChoiceResult, str, list[str]]]:
        p = req.params
        sp: dict[str, Any] = {"n": req.n, "max_tokens": p.max_tokens, "temperature": p.temperature,
                              "top_p": p.top_p, "top_k": p.top_k, "seed": p.seed, "ignore_eos": p.ignore_eos,
                              "min_tokens": p.min_tokens, "stop_token_ids": list(p.stop_token_ids),
                              "logprobs": p.logprobs if p.logprobs is not None else 0}
        body = {"token_ids": list(prompt), "sampling_params": sp, "output_mode": "text",
                "model": self.served_model_name}
        status, data = self.upstream.call("POST", "/inference/v1/generate", body, timeout=self.request_timeout_s)
        if status != 200:
            raise BadRequest(_upstream_message(data), status)
        return [self._result(prompt, c) for c in json.loads(data)["choices"]]

    def _result(self, prompt: tuple[int, ...], c: dict[str, Any]) -> tuple[ChoiceResult, str, list[str]]:
        content = (c.get("logprobs") or {}).get("content") or []
        ids = list(c["token_ids"])
        lps = [e["logprob"] for e in content]
        spans = [[self._int_version(s["version"]), s["start"], s["end"]] for s in c.get("weight_versions") or []]
        # /generate lists only the sampled token under top_logprobs (vLLM 0.32), so that is all we return
        res = ChoiceResult(prompt=prompt, token_ids=ids, logprobs=lps,
                           top_logprobs=[{t: lp} for t, lp in zip(ids, lps, strict=False)], spans=spans,
                           finish_reason=c["finish_reason"], stop_reason=c.get("stop_reason"))
        return res, c.get("text", ""), [e.get("token", "") for e in content]

    def _int_version(self, label: str) -> int:
        try:
            return int(label)
        except ValueError:  # "default": weights the server started with, before start() labelled them
            return self.version

    def weight_info(self) -> dict[str, Any]:
        info = self.upstream.json("GET", "/weight_info")
        return {**info, "version": self._int_version(str(info.get("weight_version"))), "path": self.path}


def _upstream_message(data: bytes) -> str:
    try:
        body = json.loads(data)
    except ValueError:
        return data.decode(errors="replace")[:500]
    err = body.get("error", body)
    return str(err.get("message", err) if isinstance(err, dict) else err)


def make_proxy_handler(proxy: VllmProxy) -> Route:
    """The proxy's routes (module docstring) over ``proxy``."""

    def route(call: Call) -> Reply:
        method, path = call.method, call.path
        is_open = (method, path) in OPEN_ROUTES and (path == "/health" or not proxy.require_auth_all)
        if not is_open and not authorized(call.headers.get("Authorization"), proxy.secret):
            return error_reply(401, "missing or wrong bearer token")
        if (method, path) == ("GET", "/health"):
            ok = proxy.healthy()
            return json_reply(200 if ok else 503, {"status": "ok" if ok else "unavailable"})
        if not proxy.ready:
            return error_reply(503, "the model is still loading")
        if (method, path) == ("POST", "/v1/completions"):
            return completions(call)
        if (method, path) == ("GET", "/weight_info"):
            return json_reply(200, proxy.weight_info())
        if (method, path) == ("POST", "/reload"):
            return reload(call)
        return forward(call)

    def completions(call: Call) -> Reply:
        try:
            return json_reply(200, proxy.complete(parse_completion_request(call.json())))
        except BadRequest as exc:
            return error_reply(exc.status, str(exc))

    def reload(call: Call) -> Reply:
        body = call.json() or {}
        path, version = body.get("path"), body.get("version")
        if not isinstance(path, str) or not isinstance(version, int) or isinstance(version, bool):
            return error_reply(400, 'reload needs {"path": "<checkpoint dir>", "version": <int>}')
        try:
            return json_reply(200, proxy.reload(path, version))
        except Exception as exc:
            return error_reply(500, str(exc))

    def forward(call: Call) -> Reply:
        ctype = call.headers.get("Content-Type")
        status, data = proxy.upstream.call(call.method, call.raw_path, raw=call.body or None,
                                           timeout=proxy.request_timeout_s,
                                           headers={"Content-Type": ctype} if ctype else None)
        return Reply(status, raw=data)

    return route
