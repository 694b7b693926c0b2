"""Text helpers used by the report generator and the CLI."""

from __future__ import annotations

import re


def truncate(text: str, width: int, suffix: str = "...") -> str:
    """Shorten ``text`` to at most ``width`` characters, ending with ``suffix`` when it was cut."""
    if len(text) <= width:
        return text
    return text[:width] + suffix


def slugify(text: str, sep: str = "-") -> str:
    """A lower-case ASCII slug: each run of other characters becomes one ``sep``, none at the ends."""
    words = re.split(r"[^a-z0-9]", text.lower())
    return sep.join(words)


def wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap into lines of at most ``width`` characters (a longer word gets its own line)."""
    lines: list[str] = []
    current = ""
    for word in text.split():
        candidate = f"{current} {word}" if current else word
        if len(candidate) < width or not current:
            current = candidate
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def count_words(text: str) -> int:
    """Number of whitespace-separated words in ``text``."""
    return len(text.split(" "))
