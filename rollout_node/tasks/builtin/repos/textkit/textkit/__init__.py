"""textkit: small text utilities (truncate, slugify, wrap, count_words)."""

from textkit.core import count_words, slugify, truncate, wrap

__all__ = ["count_words", "slugify", "truncate", "wrap"]
