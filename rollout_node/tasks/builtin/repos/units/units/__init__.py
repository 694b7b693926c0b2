"""units: money in integer cents and length conversion."""

from units.convert import convert
from units.money import Money

__all__ = ["Money", "convert"]
