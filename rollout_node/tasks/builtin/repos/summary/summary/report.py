"""The aggregates summarize() can report, and summarize() itself."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from summary import config

AGGREGATES: dict[str, Callable[[Sequence[int]], int]] = {
    "min": min,
    "max": max,
    "first": lambda values: values[0],
    "last": lambda values: values[-1],
}


def apply(name: str, values: Sequence[int]) -> int:
    """The aggregate called ``name`` of ``values`` (a non-empty sequence)."""
    if name not in AGGREGATES:
        raise ValueError(f"unknown aggregate {name!r}; known: {', '.join(sorted(AGGREGATES))}")
    if not values:
        raise ValueError("no values to summarize")
    return AGGREGATES[name](values)


def summarize(values: Sequence[int]) -> int:
    """The configured aggregate (``config.AGGREGATE``) of ``values``."""
    return apply(config.AGGREGATE, values)
