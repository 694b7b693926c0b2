"""intervals: half-open integer intervals and their set operations."""

from intervals.interval import Interval, merge

__all__ = ["Interval", "merge"]
