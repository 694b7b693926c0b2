"""``rollout-server``'s settings: run.yaml's ``service:`` section (``spoolrl render --service`` writes
them into the service job; ``service.<key>=value`` overrides them like any other key).

Guarantees:
- One config system: the server reads this section, built and checked like every other one
  (unknown keys, types, ranges, dotted-key errors before anything starts); its flags (``--host``,
  ``--port``, ``--trust-network``, ``--no-auth``, ``--[no-]token-level``) override it.
- :func:`trusted_networks` is the one parser of a trusted-network list and :func:`address_problem`
  the one check of an LLM server address; the config check, ``rollout-server``'s flags and
  ``/add_llm_server`` use them, so they accept and refuse the same text.
- Every key is resumable: the server's settings do not change what a run trains.
"""

from __future__ import annotations

import ipaddress

from hpc.config.base import knob, section

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
ADDRESS_SCHEMES = ("http://", "https://", "unix://")


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


def address_problem(address: str) -> str | None:
    """Why ``address`` cannot name an LLM server (None when it can)."""
    if address.strip().startswith(ADDRESS_SCHEMES):
        return None
    return f"address {address!r} must be an http(s):// URL such as http://host:8000/v1"


@section
class ServiceSection:
    """``spoolrl rollout-server``: its HTTP face, admission and backends (also as a Slurm service job:
    ``render --service`` / ``launch --service``)."""

    host: str = knob("127.0.0.1", doc="address to bind (0.0.0.0 for other hosts; the service job binds "
                     "0.0.0.0 through --host)", resumable=True)
    port: int = knob(8006, doc="TCP port (ProRL-Agent-Server's default; 0 = any free port)", min=0, max=65535,
                     resumable=True)
    auth: bool = knob(True, doc="require the bearer token (the run secret) of every client outside trust_network "
                      "(false opens every endpoint to everyone, with a warning; also --no-auth)", resumable=True)
    trust_network: str = knob(
        "", doc="comma-separated CIDRs (e.g. 10.0.0.0/8) whose clients need no bearer token; every other "
        "address still does ('' = none: every client needs the token)", resumable=True)
    token_level: bool = knob(True, doc="token IDs and logprobs on every assistant message unless a request "
                             "sends sampling_params.token_level_generation: false", resumable=True)
    max_pending: int = knob(4096, doc="/process calls in flight; above it: 503 + Retry-After", min=1,
                            resumable=True)
    retry_after_s: int = knob(5, doc="the Retry-After of that 503", min=0, resumable=True)
    timeout_s: float = knob(3600.0, doc="per /process, from admission; past it: 504 and the job is cancelled",
                            min=0.1, resumable=True)
    max_request_mb: float = knob(16.0, doc="largest request body (413 above it)", min=0.001, resumable=True)
    local_nodes: int = knob(1, doc="rollout nodes run inside the server's process (0 = only external ones: "
                            "rollout-server --node-only)", min=0, resumable=True)
    poll_s: float = knob(0.1, doc="how often the front door reads finished shards back", min=0.001,
                         resumable=True)
    llm_server: str = knob("", doc="LLM servers registered at startup, comma-separated "
                           "(http://vllm-host:8000/v1; not probed: the engine may start later)", resumable=True)
    probe_timeout_s: float = knob(10.0, doc="per request of /add_llm_server's probe (> 0)", resumable=True)

    def llm_servers(self) -> list[str]:
        """The ``llm_server`` addresses (:meth:`check` has refused a bad one)."""
        return [item.strip() for item in self.llm_server.split(",") if item.strip()]

    def check(self) -> list[str]:
        problems = []
        try:
            trusted_networks(self.trust_network)
        except ValueError as exc:
            problems.append(f"trust_network: {exc}")
        problems += [f"llm_server: {why}" for a in self.llm_servers() if (why := address_problem(a))]
        if not self.probe_timeout_s > 0:
            problems.append(f"probe_timeout_s: {self.probe_timeout_s} must be > 0 seconds")
        return problems
