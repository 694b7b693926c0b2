"""summary: reduce a list of numbers to the one aggregate the configuration names."""

from summary.report import AGGREGATES, apply, summarize

__all__ = ["AGGREGATES", "apply", "summarize"]
