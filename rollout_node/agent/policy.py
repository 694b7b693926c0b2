"""The loop's policy boundary: ``generate(prompt_ids, sampling) -> Completion``.

Anything with that method drives an episode: the inference client's per-episode session, a
scripted policy (pipeline tests, debugging) or a stand-in in benchmarks.

Guarantees a policy must keep (the loop checks the lengths):
- ``Completion.token_ids`` are the generated IDs exactly as produced, stop token included when
  the engine stopped on one; ``logprobs`` and ``versions`` have one entry per generated ID.
- ``logprobs`` are of the kind ``logprob_kind`` names: ``"processed"`` (the sampled token's
  log-probability under the distribution it was drawn from, temperature applied: what the trainer
  scores), ``"raw"`` (log-softmax of the unscaled logits) or ``"unknown"`` (the server did not say;
  the trainer refuses such samples); ``versions`` are the policy versions the server reports per token.
- ``prompt_ids`` is the loop's own growing list: a policy reads it and never mutates or keeps it
  (copying it would make each turn cost O(episode length)).
- Infrastructure failure (no server could answer) raises :class:`hpc.errors.InferenceError`; the
  loop records it as an ``inference_error`` status, it never escapes an episode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class SamplingParams:
    """What one generation request asks for."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "seed": self.seed, "stop_token_ids": list(self.stop_token_ids)}


@dataclass(frozen=True)
class Completion:
    """One generation: IDs, raw logprobs and per-token policy versions, as the engine reported them."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    finish_reason: str = "stop"  # "stop" | "length"
    logprob_kind: str = "unknown"  # "processed" | "raw" | "unknown" (see the module docstring)
    server: str = ""
    latency_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.versions) != n:
            raise ValueError(f"Completion: {n} token_ids but {len(self.logprobs)} logprobs and "
                             f"{len(self.versions)} versions")


class Policy(Protocol):
    """Generates the next assistant message as token IDs."""

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion: ...
