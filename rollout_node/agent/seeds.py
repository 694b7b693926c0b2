"""Deterministic sampling seeds.

``sampling_seed(run_seed, task_id, sample_index, attempt, turn)`` is BLAKE2b over the canonical
string ``"spoolrl-seed-v1|run_seed|task_id|sample_index|attempt|turn"``, first 8 bytes little-endian,
masked to 31 bits (every engine accepts it: vLLM's int64, torch generators, numpy).

Guarantees: the same five inputs give the same seed on every machine and Python version (no
``hash()``, which is salted per process); changing any one input changes the seed (up to 31-bit
collisions, which are harmless: they only repeat a random stream for a different prompt). A retry
after an infrastructure failure (``attempt + 1``) therefore samples differently, while a failover
inside one attempt re-sends the very same request, seed included.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SEED_BITS = 31


def sampling_seed(run_seed: int, task_id: str, sample_index: int, attempt: int, turn: int) -> int:
    key = f"spoolrl-seed-v1|{run_seed}|{task_id}|{sample_index}|{attempt}|{turn}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << SEED_BITS) - 1)


@dataclass(frozen=True)
class EpisodeSeed:
    """The per-episode part of the seed; ``for_turn`` completes it."""

    run_seed: int
    task_id: str
    sample_index: int = 0
    attempt: int = 0

    def for_turn(self, turn: int) -> int:
        return sampling_seed(self.run_seed, self.task_id, self.sample_index, self.attempt, turn)
