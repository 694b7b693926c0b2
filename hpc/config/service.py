"""The rollout service's settings that belong to the run (``spoolrl render --service`` writes them
into the service job): which client networks may call ``rollout-server`` without the bearer token.

Guarantee: :func:`trusted_networks` is the one parser of a trusted-network list; the config check and
``rollout-server --trust-network`` both use it, so they accept and refuse the same text.
"""

from __future__ import annotations

import ipaddress

from hpc.config.base import knob, section

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_networks(text: str) -> tuple[Network, ...]:
    """``"10.0.0.0/8,fd00::/8"`` -> networks; raises ValueError naming the bad entry and the fix."""
    out = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            out.append(ipaddress.ip_network(item, strict=True))
        except ValueError as exc:
            raise ValueError(f"{item!r} is not a network in CIDR form ({exc}); write e.g. 10.0.0.0/8 or "
                             "192.168.1.7/32, several separated by commas") from exc
    return tuple(out)


@section
class ServiceSection:
    """``spoolrl rollout-server`` as a Slurm service job (``render --service`` / ``launch --service``)."""

    trust_network: str = knob(
        "", doc="comma-separated CIDRs (e.g. 10.0.0.0/8) whose clients need no bearer token; every other "
        "address still does ('' = none: every client needs the token)", resumable=True)

    def check(self) -> list[str]:
        try:
            trusted_networks(self.trust_network)
        except ValueError as exc:
            return [f"trust_network: {exc}"]
        return []
