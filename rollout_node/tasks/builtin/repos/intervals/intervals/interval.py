"""Half-open integer intervals ``[start, end)``: ``start`` is included, ``end`` is not."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Interval:
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")

    def __len__(self) -> int:
        return self.end - self.start

    def contains(self, x: int) -> bool:
        """Whether ``x`` lies in the interval."""
        return self.start <= x <= self.end

    def overlaps(self, other: Interval) -> bool:
        """Whether the two intervals share at least one point."""
        return self.start <= other.end and other.start <= self.end

    def intersection(self, other: Interval) -> Interval | None:
        """The common part, or None when the intervals share no point."""
        start = max(self.start, other.start)
        end = min(self.end, other.end)
        return Interval(start, end)


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union as a sorted list of disjoint intervals (overlapping or touching ones are joined)."""
    merged: list[Interval] = []
    for iv in sorted(intervals):
        if merged and iv.start <= merged[-1].end:
            merged[-1] = Interval(merged[-1].start, iv.end)
        else:
            merged.append(iv)
    return merged
