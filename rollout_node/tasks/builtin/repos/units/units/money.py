"""Money amounts in integer minor units (cents), never floats."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Money:
    cents: int
    currency: str = "EUR"

    @classmethod
    def parse(cls, text: str, currency: str = "EUR") -> Money:
        """``"12.34"`` -> 1234 cents, ``"7"`` -> 700, ``"-0.50"`` -> -50."""
        whole, _, frac = text.strip().partition(".")
        frac = (frac + "00")[:2]
        return cls(int(whole) * 100 + int(frac), currency)

    def __add__(self, other: Money) -> Money:
        return Money(self.cents + other.cents, self.currency)

    def format(self) -> str:
        sign = "-" if self.cents < 0 else ""
        whole, frac = divmod(abs(self.cents), 100)
        return f"{sign}{whole}.{frac:02d} {self.currency}"

    def split(self, parts: int) -> list[Money]:
        """``parts`` amounts that differ by at most one cent and add up to this amount."""
        share = self.cents // parts
        return [Money(share, self.currency) for _ in range(parts)]
