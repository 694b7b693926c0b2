"""What one agent episode produced: the token record, per-turn log, stop reason and timings.

Guarantees:
- ``token_ids``/``loss_mask``/``logprobs``/``policy_versions`` are aligned and obey the
  :class:`hpc.trajectory.Trajectory` rules (mask 1 only on generated tokens, logprob 0 and
  version -1 elsewhere); :meth:`EpisodeResult.trajectory_fields` gives exactly the Trajectory
  fields the agent knows (the pipeline adds ids, reward and attempt).
- Every turn's prompt is a prefix of the final ``token_ids``: turn ``k`` sent
  ``token_ids[:turns[k].prompt_len]`` and got back ``token_ids[prompt_len:prompt_len + n]``;
  the log keeps offsets, not copies, so a long episode stays O(length) in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpc.errors import InferenceError, SandboxError
from hpc.trajectory import Status
from rollout_node.agent.policy import Completion, SamplingParams
from rollout_node.agent.toolcall import ParseError, ToolCall

STOP_REASONS = ("submit", "max_turns", "max_tokens", "context", "inference_error", "sandbox_error",
                "cancelled", "timeout")


@dataclass
class TurnRecord:
    """One request/response of the episode and what the loop did with it."""

    turn: int
    prompt_len: int
    sampling: SamplingParams
    completion: Completion
    eot_appended: bool = False          # <|im_end|> appended with mask 0 (engine did not stop on it)
    call: ToolCall | ParseError | None = None
    observation: str = ""
    observation_tokens: int = 0         # tokens appended after the completion (mask 0), 0 if none
    observation_truncated: bool = False
    generate_s: float = 0.0
    tool_s: float = 0.0


@dataclass
class EpisodeResult:
    """An episode's outcome; the token arrays are plain lists until the pipeline builds a Trajectory."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    policy_versions: list[int]
    prompt_len: int
    status: Status = Status.OK
    stop_reason: str = "submit"
    submitted: bool = False
    error: str = ""
    turns: list[TurnRecord] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)

    def metrics(self) -> dict[str, Any]:
        calls = [t.call for t in self.turns]
        return {
            "turns": len(self.turns), "submitted": self.submitted, "stop_reason": self.stop_reason,
            "tool_calls": sum(isinstance(c, ToolCall) for c in calls),
            "malformed_calls": sum(isinstance(c, ParseError) and c.kind != "no_call" for c in calls),
            "no_calls": sum(isinstance(c, ParseError) and c.kind == "no_call" for c in calls),
            "eot_appended": sum(t.eot_appended for t in self.turns),
            "observations_truncated": sum(t.observation_truncated for t in self.turns),
            "generated_tokens": sum(self.loss_mask), "servers": sorted({t.completion.server for t in self.turns}),
            **({"error": self.error} if self.error else {}),
        }

    @property
    def logprob_kind(self) -> str:
        """The servers' logprob kind for this episode: one kind, or ``"mixed"`` (never trainable)."""
        kinds = {t.completion.logprob_kind for t in self.turns if t.completion.token_ids}
        return kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "processed")

    def raise_for_infrastructure(self) -> None:
        """For callers that want infrastructure faults as exceptions (the pipeline's policy contract):
        ``inference_error`` -> InferenceError, ``sandbox_error`` -> SandboxError; the record stays valid."""
        if self.status == Status.INFERENCE_ERROR:
            raise InferenceError(self.error or "inference failed")
        if self.status == Status.SANDBOX_ERROR:
            raise SandboxError(self.error or "sandbox failed")

    def trajectory_fields(self) -> dict[str, Any]:
        """Keyword arguments for :class:`hpc.trajectory.Trajectory` that the agent loop owns."""
        return {
            "token_ids": self.token_ids, "loss_mask": self.loss_mask, "logprobs": self.logprobs,
            "policy_versions": self.policy_versions, "logprob_kind": self.logprob_kind, "status": self.status,
            "prompt_len": self.prompt_len, "timings": dict(self.timings), "metrics": self.metrics(),
            "sampling": dict(self.sampling),
        }
