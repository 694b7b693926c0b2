"""The per-turn token record: what one model call of an episode sent and got back.

Guarantees:
- ``input_ids`` are the exact prompt IDs sent to the backend for that call, ``token_ids`` the IDs it
  generated, ``logprobs`` one behaviour logprob per generated ID (checked at construction).
- :func:`turns_of` cuts the records out of an episode's one token stream (token-in/token-out: every
  turn's prompt is a prefix of the final ``token_ids``), so nothing is re-tokenized, and it checks
  the prefix rule: turn k+1's ``input_ids`` start with turn k's ``input_ids + token_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TurnTokens:
    """One model call (see the module docstring)."""

    input_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"{len(self.logprobs)} logprobs for {len(self.token_ids)} generated tokens")

    def extended_by(self, later: TurnTokens) -> bool:
        """True when ``later``'s prompt starts with this call's prompt and generation, token for token."""
        n, m = len(self.input_ids), len(self.token_ids)
        return later.input_ids[:n] == self.input_ids and later.input_ids[n:n + m] == self.token_ids

    def fields(self) -> dict[str, list[int] | list[float]]:
        """The ProRL message fields (``input_ids``, ``token_ids``, ``logprobs``)."""
        return {"input_ids": list(self.input_ids), "token_ids": list(self.token_ids), "logprobs": list(self.logprobs)}


def turns_of(episode_ids: Sequence[int], calls: Sequence[tuple[int, Sequence[int], Sequence[float]]]) -> list[TurnTokens]:
    """Records for ``calls`` = (prompt length, generated IDs, logprobs) of each call of one episode whose
    final token stream is ``episode_ids``; raises ValueError where the prefix rule does not hold."""
    turns = [TurnTokens(tuple(episode_ids[:n]), tuple(ids), tuple(lps)) for n, ids, lps in calls]
    for k in range(1, len(turns)):
        if not turns[k - 1].extended_by(turns[k]):
            raise ValueError(f"turn {k}'s prompt does not extend turn {k - 1}'s prompt + generation")
    return turns
