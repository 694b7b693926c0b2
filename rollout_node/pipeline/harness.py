"""``rollout.policy: harness``: an unmodified agent harness runs in the episode's sandbox and talks to
the node's gateway (:mod:`rollout_node.gateway`), which records the episode token for token.

One episode: open a gateway session; start ONE process in a fresh sandbox on the episode's image and
work dir (:meth:`~rollout_node.sandbox.sandbox.Sandbox.exec`: no network, its own pid namespace) with
three read-only mounts (``rollout.harness.prefix`` at :data:`~hpc.config.rollout.HARNESS_INSIDE`, the
gateway's Unix socket, the problem statement); inside, the stdlib relay (:mod:`rollout_node.sandbox.relay`)
listens on the sandbox's loopback and forwards to the socket, then ``rollout.harness.command`` runs by
bash in ``/work`` with ``OPENAI_BASE_URL`` / ``OPENAI_API_BASE`` = ``http://127.0.0.1:PORT/v1``,
``OPENAI_API_KEY`` = the session's key, ``SPOOLRL_TASK_FILE`` and the statement on stdin, ``HOME=/tmp``
(a harness's own config and logs never land in the diff), the prefix's ``bin`` first on ``PATH`` and
``rollout.harness.env``. When it exits, the session is closed (its key is refused from then on) and
the stage takes the working tree's diff (``rollout.harness.submit: diff``).

Guarantees:
- The harness's whole process tree is dead when :meth:`HarnessPolicy.run_episode` returns: the launch
  ends with its pid namespace, and past the RUN budget or on a stop request (cancellation, drain,
  staleness) the launcher's tree is killed; EVAL therefore never runs beside it.
- Outcomes: the harness exiting (any status), crashing or looping until the budget is the agent's
  outcome (``ok``, or ``timeout`` past ``rollout.run_timeout_s``, time waiting for the inference
  server not counted, as for the built-in agent; a call the gateway refused for lack of room in
  ``rollout.max_tokens`` makes it ``truncated``); a backend or gateway failure recorded by the session
  raises :class:`~hpc.errors.InferenceError`, a relay that did not start or a harness that never got an
  answer from the gateway (nothing of the policy to train: a broken install or command, or requests the
  gateway refuses, e.g. a temperature other than the run's: the last refusal is in the message)
  :class:`~hpc.errors.SandboxError` (infrastructure: retried, then excluded with the reason).
- The record is the session's segments, never re-tokenized: one segment is the episode's transcript;
  when the harness rewrote its history, every segment becomes a trajectory of its own (its own prompt),
  all sharing the episode's reward and counted as one sample of the group
  (:meth:`~rollout_node.pipeline.episode.Episode.trajectories`). ``segments_per_episode``,
  ``reprefill_tokens``, ``harness_calls`` and the time split (``gateway_llm_s``, ``gateway_s``) are in
  the trajectory's metrics.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hpc.config.rollout import HARNESS_INSIDE, HarnessConfig
from hpc.errors import InferenceError, SandboxError, UsageError
from hpc.trajectory import Status
from rollout_node.agent import AgentLimits, EpisodeSeed
from rollout_node.agent.client import InferenceClient
from rollout_node.agent.policy import Completion, SamplingParams
from rollout_node.agent.policy import Policy as Backend
from rollout_node.agent.template import ChatTemplate
from rollout_node.pipeline.harness_install import check_prefix
from rollout_node.pipeline.llm import VersionTap, tokenizer_dir
from rollout_node.pipeline.policy import EpisodeContext, EpisodeOutput
from rollout_node.sandbox.result import ToolResult
from rollout_node.sandbox.runtimes import PATH_INSIDE, Bind
from rollout_node.sandbox.sandbox import Sandbox, user_scratch

if TYPE_CHECKING:
    from hpc.config import RunConfig
    from hpc.paths import RunPaths
    from rollout_node.gateway.server import Gateway
    from rollout_node.gateway.session import GatewaySampling, SessionTrace

RELAY_SOURCE = (Path(__file__).parent.parent / "sandbox" / "relay.py").read_text()
SOCKET_INSIDE = "/run/spoolrl/gateway.sock"
TASK_INSIDE = "/run/spoolrl/task.md"
PORT_FILE = "/tmp/.spoolrl-relay-port"
RELAY_FAILED = 97  # the launch script's status when the relay did not come up (infrastructure)
OUTPUT_KEPT = 4000  # characters of the harness's output kept in the metrics (head and tail)
HARD_CAP_S = 7 * 24 * 3600.0  # the launch's own timeout; the RUN budget ends it through ``stop``
# $1 relay source, $2 socket, $3 port file, $4 the harness's command line
LAUNCH_SCRIPT = f"""/usr/bin/python3 -c "$1" "$2" "$3" &
i=0
while [ ! -s "$3" ]; do
  i=$((i + 1))
  if [ "$i" -gt 400 ]; then echo "spoolrl: the gateway relay did not start" >&2; exit {RELAY_FAILED}; fi
  sleep 0.05
done
OPENAI_BASE_URL="http://127.0.0.1:$(cat "$3")/v1"
export OPENAI_BASE_URL OPENAI_API_BASE="$OPENAI_BASE_URL"
cd /work && exec /bin/bash -c "$4" < "$SPOOLRL_TASK_FILE"
"""


def harness_env(cfg: HarnessConfig, key: str) -> dict[str, str]:
    """The harness's environment inside the sandbox (``OPENAI_BASE_URL`` is added by the launch script,
    which knows the relay's port)."""
    return {**cfg.env, "OPENAI_API_KEY": key, "SPOOLRL_TASK_FILE": TASK_INSIDE, "HOME": "/tmp",
            "PATH": f"{HARNESS_INSIDE}/bin:{PATH_INSIDE}"}


def run_harness(sandbox: object, cfg: HarnessConfig, *, key: str, socket_path: Path, problem: str,
                stop: Callable[[], bool], timeout_s: float = HARD_CAP_S) -> ToolResult:
    """Run ``cfg.command`` once in a fresh sandbox beside ``sandbox``'s (same image, same /work) against the
    gateway socket; returns when it exited or its tree was killed (``timed_out``: ``stop()`` or the timeout).
    Raises SandboxError when the sandbox or the relay failed."""
    assert isinstance(sandbox, Sandbox)
    task_dir = sandbox.scratch / "harness"
    task_dir.mkdir(parents=True, exist_ok=True)
    task_file = task_dir / "task.md"
    task_file.write_text(problem if problem.endswith("\n") else problem + "\n")
    binds = (Bind(Path(cfg.prefix), HARNESS_INSIDE), Bind(Path(socket_path), SOCKET_INSIDE),
             Bind(task_file, TASK_INSIDE))
    argv = ["/bin/sh", "-c", LAUNCH_SCRIPT, "sh", RELAY_SOURCE, SOCKET_INSIDE, PORT_FILE, cfg.command]
    result = sandbox.exec(argv, timeout_s=timeout_s, env=harness_env(cfg, key), binds=binds, stop=stop)
    if result.exit_code == RELAY_FAILED and "gateway relay did not start" in result.output:
        raise SandboxError("the harness's gateway relay did not start in the sandbox")
    return result


@dataclass
class ScriptedBackend:
    """A stand-in for the policy's inference servers (no LLM here): answers call ``i`` with ``replies[i]``
    (then the last one again; a callable reply is given the prompt's text and returns the reply) as the
    template's token IDs + end of turn, logprob ``-0.5``, version 0, ``logprob_kind`` "synthetic" unless
    told (the trainer refuses it). It records every prompt it was sent and every completion it returned.
    Used by ``spoolrl harness check`` and the tests."""

    template: ChatTemplate
    replies: Sequence[str | Callable[[str], str]]
    logprob_kind: str = "synthetic"
    prompts: list[tuple[int, ...]] = field(default_factory=list)
    completions: list[tuple[int, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
        with self._lock:
            reply = self.replies[min(len(self.prompts), len(self.replies) - 1)]
            text = reply if isinstance(reply, str) else reply(self.template.decode(prompt_ids))
            ids = (*self.template.encode_content(text)[: max(0, sampling.max_tokens - 1)], self.template.im_end)
            self.prompts.append(tuple(prompt_ids))
            self.completions.append(ids)
        return Completion(ids, (-0.5,) * len(ids), (0,) * len(ids), logprob_kind=self.logprob_kind)


def _tail(text: str) -> str:
    return text if len(text) <= OUTPUT_KEPT else text[: OUTPUT_KEPT // 2] + "\n[...]\n" + text[-OUTPUT_KEPT // 2:]


def trace_metrics(trace: SessionTrace, result: ToolResult) -> dict[str, object]:
    return {"segments_per_episode": len(trace.segments), "reprefill_tokens": trace.reprefill_tokens,
            "harness_calls": trace.calls, "harness_exit_code": result.exit_code,
            "gateway_llm_s": round(trace.llm_s, 4), "gateway_s": round(trace.gateway_s, 4),
            "harness_s": round(result.duration_s, 4), "generated_tokens": trace.generated_tokens,
            "harness_output": _tail(str(result.output))}


class HarnessPolicy:
    """``rollout.policy: harness`` (see the module docstring): one gateway for the node, one session per
    episode. ``backend_for(ctx)`` is the episode's backend (the inference client's session, or a stand-in)."""

    def __init__(self, cfg: HarnessConfig, gateway: Gateway, template: ChatTemplate,
                 sampling_for: Callable[[EpisodeContext], GatewaySampling],
                 backend_for: Callable[[EpisodeContext], Backend],
                 on_close: Callable[[], None] = lambda: None, not_ready: Callable[[], str] = lambda: "") -> None:
        self.cfg, self.gateway, self.template = cfg, gateway, template
        self.sampling_for, self.backend_for, self._on_close = sampling_for, backend_for, on_close
        self.not_ready = not_ready  # why the node should not claim now ('' = ready; the claim gate asks)

    def close(self) -> None:
        self.gateway.close()
        self._on_close()

    def session_sampling(self, ctx: EpisodeContext) -> GatewaySampling:
        """How the episode's session samples (``sampling_for``; the service overrides it per request)."""
        return self.sampling_for(ctx)

    def run_episode(self, ctx: EpisodeContext) -> EpisodeOutput:
        session = self.gateway.open_session(f"{ctx.task_id}:s{ctx.sample_index}:a{ctx.attempt}",
                                            self.backend_for(ctx), self.template, self.session_sampling(ctx))
        try:
            result = run_harness(ctx.sandbox, self.cfg, key=session.key, socket_path=session.socket_path,
                                 problem=ctx.task.problem_statement or ctx.task_id,
                                 stop=ctx.should_stop)
        finally:
            trace = session.close()
        if trace.error:
            raise InferenceError(f"harness episode: {trace.error}")
        segments = list(trace.segments)
        if not segments and not ctx.stop_event.is_set():
            # nothing of the policy to train: the install or the command is broken (retried, then excluded;
            # a node where every episode ends so stops itself: rollout.max_consecutive_infra_faults)
            refused = f"; the gateway refused its calls ({trace.refused})" if trace.refused else ""
            raise SandboxError(f"the harness made no call that the gateway answered (exit {result.exit_code})"
                               f"{refused}: {_tail(str(result.output))[-1500:]}")
        if segments:
            ctx.transcript.replace(segments[-1])
        status = Status.OK
        if result.timed_out and not ctx.stop_event.is_set():
            status = Status.TIMEOUT
        elif trace.context_exhausted:
            status = Status.TRUNCATED
        return EpisodeOutput(status=status, metrics=trace_metrics(trace, result), sampling=dict(trace.sampling),
                             logprob_kind=trace.logprob_kind, segments=segments[:-1])


def build_harness_policy(paths: RunPaths, config: RunConfig, *, client: InferenceClient | None = None,
                         cls: type[HarnessPolicy] = HarnessPolicy) -> HarnessPolicy:
    """The node's harness policy (a ``cls``): ``client`` (default: the run's inference client) as every
    session's backend (the samples of a
    task stick to one server; versions reach the transcript as they arrive, so the staleness check sees a
    running episode; time waiting for a server is not charged to RUN), the model's chat template, and one
    gateway on a node-local socket. Raises UsageError when ``rollout.harness.prefix`` is not an install."""
    from rollout_node.gateway.server import Gateway
    from rollout_node.gateway.session import GatewaySampling

    if problems := check_prefix(config.rollout.harness.prefix):
        raise UsageError("; ".join(problems))
    template = ChatTemplate.from_model_dir(tokenizer_dir(paths, config))
    client = client or InferenceClient.from_config(config.inference, run_dir=paths.root)
    limits = AgentLimits.from_config(config.rollout, config.inference)
    context: list[int] = []

    def sampling_for(ctx: EpisodeContext) -> GatewaySampling:
        if not context and (n := client.max_model_len()) is not None:
            context.append(n)  # once the servers are up: their context length bounds every segment
        bounded = dataclasses.replace(limits, context_len=context[0]) if context else limits
        return GatewaySampling.from_limits(bounded, EpisodeSeed(config.run.seed, ctx.task_id, ctx.sample_index,
                                                                ctx.attempt))

    socket_path = user_scratch(config.sandbox) / f"gw-{os.getpid()}-{secrets.token_hex(3)}.sock"
    gateway = Gateway(socket_path).start()
    return cls(config.rollout.harness, gateway, template, sampling_for,
                         lambda ctx: VersionTap(client.session(ctx.task_id, ctx.patient, ctx.stop_event.is_set), ctx), on_close=client.close,
                         not_ready=lambda: "" if client.endpoints.live() else "no_inference_server")
