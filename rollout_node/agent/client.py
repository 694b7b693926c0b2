"""The inference client: token IDs in, token IDs + raw logprobs + per-token policy versions out.

Concurrency model: threads. One :class:`InferenceClient` per rollout node is shared by all episode
threads; each episode takes an :class:`EpisodeSession` (the loop's ``Policy``). Blocking stdlib
HTTP keeps the code plain, and the GIL is released while waiting on sockets, which is where an
episode spends its time.

Guarantees:
- Requests use vLLM's ``/v1/completions`` subset with a token-ID ``prompt`` (see the brief):
  ``return_token_ids``, ``logprobs=1`` (raw logprobs), ``seed``, ``stop_token_ids``,
  ``return_weight_versions``. Per-token versions come ONLY from the response's ``weight_versions``
  spans; a response without complete spans is a protocol error, never filled in by guessing.
- Stickiness: a session keeps its server (rendezvous hash of the session key over the live
  servers, so samples of one group share a prefix cache) until that server fails.
- Failures: each request gets ``1 + max_retries`` attempts. A transient failure puts the server
  in cooldown and the session fails over to another live server at once, re-sending the same
  token prompt and seed; with no other server it waits (exponential backoff, full jitter) and
  tries again. When the attempts are spent and still no server answers (an outage: the only
  server restarting, the inference group requeued), it keeps trying until ``outage_wait_s`` has
  passed since the first failure, so that a restart does not turn every episode in flight into
  an infrastructure fault (and the node's fault streak into a self-stop). After that, or at once
  when the server rejects the request (4xx) or answers malformed data,
  :class:`hpc.errors.InferenceError` is raised: the loop records ``inference_error``; nothing
  here kills the node. :meth:`InferenceClient.close` ends every wait at once.
- Authentication: with a ``token`` (``from_config`` reads the run secret, ``RUN/control/secret``)
  every request to every server carries ``Authorization: Bearer <token>``.
- At most ``max_concurrent_per_server`` requests are in flight to one server from this client.
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc.config import InferenceConfig
from hpc.errors import InferenceError
from hpc.paths import RunPaths
from hpc.trajectory import LOGPROB_MAX
from rollout_node.agent.endpoints import EndpointDirectory, EndpointSource, StaticEndpoints
from rollout_node.agent.http import FatalHTTPError, HTTPTransport, RequestAborted, TransientHTTPError
from rollout_node.agent.policy import Completion, SamplingParams


class ProtocolError(Exception):
    """The server answered 200 with something that breaks the token-in/token-out contract."""


def versions_from_spans(spans: Any, n: int) -> tuple[int, ...]:
    """Per-token versions from ``[{"version", "start", "end"}]`` spans that must cover ``0..n``."""
    if not isinstance(spans, list):
        raise ProtocolError("response has no weight_versions spans (needed for per-token policy versions)")
    out: list[int | None] = [None] * n
    for span in spans:
        try:
            version, start, end = int(span["version"]), int(span["start"]), int(span["end"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"bad weight_versions span {span!r}") from exc
        if not 0 <= start <= end <= n or version < 0:
            raise ProtocolError(f"weight_versions span {span!r} out of range for {n} tokens")
        out[start:end] = [version] * (end - start)
    if any(v is None for v in out):
        raise ProtocolError(f"weight_versions spans {spans!r} do not cover all {n} generated tokens")
    return tuple(v for v in out if v is not None)


# a server's ``logprobs_mode`` (vLLM's names) -> the trajectory's ``logprob_kind``
LOGPROB_KINDS = {"processed_logprobs": "processed", "raw_logprobs": "raw"}


def parse_completion(data: Any, prompt_ids: Sequence[int], server: str, latency_s: float) -> Completion:
    """Validate a ``/v1/completions`` answer and turn it into a :class:`Completion`."""
    try:
        choice = data["choices"][0]
        ids = tuple(int(i) for i in choice["token_ids"])
        logprobs = tuple(float(x) for x in choice["logprobs"]["token_logprobs"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ProtocolError(f"response lacks choices[0].token_ids / logprobs.token_logprobs: {exc!r}") from exc
    if len(logprobs) != len(ids):
        raise ProtocolError(f"{len(ids)} token_ids but {len(logprobs)} token_logprobs")
    if not all(math.isfinite(x) and x <= LOGPROB_MAX for x in logprobs):
        raise ProtocolError("token_logprobs must be finite and <= 0")
    echoed = choice.get("prompt_token_ids")
    if echoed is not None and list(echoed) != list(prompt_ids):
        raise ProtocolError(f"server echoed other prompt_token_ids ({len(echoed)}) than were sent ({len(prompt_ids)})")
    versions = versions_from_spans(choice.get("weight_versions"), len(ids))
    return Completion(token_ids=ids, logprobs=logprobs, versions=versions,
                      finish_reason=str(choice.get("finish_reason") or ""),
                      logprob_kind=LOGPROB_KINDS.get(str(choice.get("logprobs_mode")), "unknown"),
                      server=server, latency_s=latency_s)


def run_secret(run_dir: Path) -> str | None:
    """The run's bearer secret (``RUN/control/secret``, written 0600 by ``spoolrl init``); None if absent."""
    try:
        text = RunPaths(run_dir).secret.read_text().strip()
    except FileNotFoundError:
        return None
    return text or None


@dataclass
class _Server:
    url: str
    transport: HTTPTransport
    slots: threading.BoundedSemaphore
    cooldown_until: float = 0.0
    failures: int = 0
    model: str | None = None


_INFERENCE = InferenceConfig()  # the defaults, stated once in hpc/config


@dataclass(frozen=True)
class RetryPolicy:
    """Per-request retries (``inference.max_retries``) with jittered backoff and a server cooldown.

    The backoff and cooldown are not config knobs; ``max_retries`` defaults to the config's."""

    max_retries: int = _INFERENCE.max_retries
    outage_wait_s: float = _INFERENCE.outage_wait_s
    backoff_base_s: float = 0.5
    backoff_max_s: float = 10.0
    cooldown_s: float = 30.0

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Full jitter: uniform in [0, min(max, base * 2**attempt)]."""
        return rng.uniform(0.0, min(self.backoff_max_s, self.backoff_base_s * 2 ** min(attempt, 30)))

    @classmethod
    def from_config(cls, cfg: InferenceConfig) -> RetryPolicy:
        return cls(max_retries=cfg.max_retries, outage_wait_s=cfg.outage_wait_s)

    def gives_up(self, attempts: int, failing_since: float) -> bool:
        """After ``attempts`` failed attempts, the first at ``failing_since`` (monotonic): stop trying?"""
        return attempts > self.max_retries and time.monotonic() - failing_since >= self.outage_wait_s


class InferenceClient:
    """Shared by all episode threads of a node; hands out sticky :class:`EpisodeSession` objects."""

    def __init__(self, endpoints: EndpointSource | Sequence[str], *, model: str | None = None,
                 request_timeout_s: float = _INFERENCE.request_timeout_s,
                 max_concurrent_per_server: int = _INFERENCE.max_concurrent_per_server,
                 retry: RetryPolicy = RetryPolicy(), seed: int | None = None, token: str | None = None) -> None:
        self.token = token
        self.endpoints: EndpointSource = (StaticEndpoints(list(endpoints)) if isinstance(endpoints, list | tuple)
                                          else endpoints)  # type: ignore[assignment]
        self.model = model
        self.request_timeout_s = request_timeout_s
        self.max_concurrent = max_concurrent_per_server
        self.retry = retry
        self._rng = random.Random(seed)
        self._servers: dict[str, _Server] = {}
        self._lock = threading.Lock()
        self.closed = threading.Event()  # set by close(): sessions stop waiting for a server

    @classmethod
    def from_config(cls, cfg: InferenceConfig, *, run_dir: str | Path | None = None, urls: Sequence[str] = (),
                    **kwargs: Any) -> InferenceClient:
        """From an :class:`hpc.config.inference.InferenceConfig` and a run dir (or explicit URLs).

        With a run dir, requests carry its secret (``RUN/control/secret``) unless ``token`` is given.
        """
        if run_dir is not None and "token" not in kwargs:
            kwargs["token"] = run_secret(Path(run_dir))
        source: EndpointSource = (StaticEndpoints(list(urls)) if urls
                                  else EndpointDirectory(Path(run_dir or ".") / "endpoints"))
        retry = RetryPolicy.from_config(cfg)
        return cls(source, request_timeout_s=cfg.request_timeout_s, retry=retry,
                   max_concurrent_per_server=cfg.max_concurrent_per_server, **kwargs)

    def session(self, key: str, patient: Callable[[], bool] = lambda: True,
                stopped: Callable[[], bool] = lambda: False) -> EpisodeSession:
        """A sticky session for one episode; while ``patient()`` is False (the episode is stopping, the node
        draining: servers going away are then no reason to hold on) a failed request is not retried after
        a backoff and no outage is waited out. When ``stopped()`` turns true (the episode was cancelled or
        aborted) a request in flight is abandoned within 0.25 s: its connection is closed (the server sees
        the client go) and :class:`~hpc.errors.InferenceError` raised."""
        return EpisodeSession(self, key, patient, stopped)

    def _server(self, url: str) -> _Server:
        with self._lock:
            srv = self._servers.get(url)
            if srv is None:
                srv = self._servers[url] = _Server(
                    url, HTTPTransport(url, timeout_s=self.request_timeout_s, token=self.token),
                    threading.BoundedSemaphore(self.max_concurrent))
            return srv

    def pick(self, key: str, exclude: str | None = None) -> str | None:
        """Rendezvous-hash choice among live servers, out-of-cooldown ones first; None if none is live."""
        live = [u for u in self.endpoints.live() if u != exclude] or self.endpoints.live()
        if not live:
            return None
        now = time.monotonic()
        ready = [u for u in live if self._server(u).cooldown_until <= now]
        if not ready:  # everyone is cooling down: the one that recovers first
            return min(live, key=lambda u: self._server(u).cooldown_until)
        return max(ready, key=lambda u: hashlib.blake2b(f"{key}|{u}".encode(), digest_size=8).digest())

    def ready(self, url: str) -> bool:
        return self._server(url).cooldown_until <= time.monotonic()

    def mark_failed(self, url: str) -> None:
        srv = self._server(url)
        with self._lock:
            srv.failures += 1
            srv.cooldown_until = time.monotonic() + self.retry.cooldown_s

    def _model_of(self, srv: _Server, abort: Callable[[], bool] | None = None) -> str | None:
        if self.model is not None or srv.model is not None:
            return self.model or srv.model
        data = srv.transport.request("GET", "/v1/models", abort=abort)
        try:
            srv.model = str(data["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            srv.model = None
        return srv.model

    def max_model_len(self) -> int | None:
        """The smallest ``max_model_len`` the live servers report in ``/v1/models`` (None if none says)."""
        lengths = []
        for url in self.endpoints.live():
            try:
                data = self._server(url).transport.request("GET", "/v1/models")
                lengths.append(int(data["data"][0]["max_model_len"]))
            except (TransientHTTPError, FatalHTTPError, KeyError, IndexError, TypeError, ValueError):
                continue
        return min(lengths) if lengths else None

    def complete(self, url: str, prompt_ids: Sequence[int], sampling: SamplingParams,
                 abort: Callable[[], bool] | None = None) -> Completion:
        """One attempt against one server (raises Transient/FatalHTTPError, ProtocolError, or RequestAborted
        when ``abort()`` turned true while it waited)."""
        srv = self._server(url)
        with srv.slots:
            body: dict[str, Any] = {
                "prompt": list(prompt_ids), "logprobs": 1, "return_token_ids": True,
                "return_weight_versions": True, **sampling.as_dict(),
            }
            model = self._model_of(srv, abort)
            if model is not None:
                body["model"] = model
            if body["seed"] is None:
                del body["seed"]
            t0 = time.perf_counter()
            data = srv.transport.request("POST", "/v1/completions", body, abort=abort)
            completion = parse_completion(data, prompt_ids, url, time.perf_counter() - t0)
        srv.failures = 0
        return completion

    def close(self) -> None:
        self.closed.set()
        with self._lock:
            servers = list(self._servers.values())
        for srv in servers:
            srv.transport.close()


@dataclass
class EpisodeSession:
    """One episode's view of the client: sticks to one server, fails over when it dies (a ``Policy``)."""

    client: InferenceClient
    key: str
    patient: Callable[[], bool] = lambda: True
    stopped: Callable[[], bool] = lambda: False
    server: str | None = None
    failovers: int = 0
    errors: list[str] = field(default_factory=list)

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
        retry = self.client.retry
        failing_since = time.monotonic()
        attempt = 0
        while True:
            failed_over = False
            if self.server is None:
                self.server = self.client.pick(self.key)
            if self.server is not None:
                try:
                    completion = self.client.complete(self.server, prompt_ids, sampling, abort=self.stopped)
                    completion.meta["failovers"] = self.failovers
                    return completion
                except RequestAborted as exc:
                    raise InferenceError(f"the episode stopped while its request to {self.server} was in flight; "
                                         "the connection was closed") from exc
                except (FatalHTTPError, ProtocolError) as exc:
                    raise InferenceError(f"inference server {self.server} rejected the request: {exc}") from exc
                except TransientHTTPError as exc:
                    self.errors.append(str(exc))
                    failed_over = self._fail_over()  # another server is ready: try it at once
            else:
                self.errors.append("no live inference server")
            attempt += 1
            if retry.gives_up(attempt, failing_since) or (attempt > retry.max_retries and not self.patient()):
                break
            if not failed_over and self._sleep(retry.backoff(attempt - 1, self.client._rng)):
                break
        waited = time.monotonic() - failing_since
        raise InferenceError(f"no inference server answered after {attempt} attempts in {waited:.0f} s "
                             f"(inference.outage_wait_s={retry.outage_wait_s:g}; last error: "
                             f"{self.errors[-1] if self.errors else 'none'}); "
                             "check the inference servers and RUN/endpoints")

    def _sleep(self, seconds: float) -> bool:
        """Back off for ``seconds`` in short slices; True when the client closed or patience ran out."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self.client.closed.wait(min(left, 0.25)) or not self.patient():
                return True
        return False

    def _fail_over(self) -> bool:
        """Cool the failed server down and move to another; True when there is a different one."""
        assert self.server is not None
        failed, self.server = self.server, None
        self.client.mark_failed(failed)
        self.server = self.client.pick(self.key, exclude=failed)
        if self.server is not None and self.server != failed and self.client.ready(self.server):
            self.failovers += 1
            return True
        return False  # nobody else is ready: back off before the next attempt
