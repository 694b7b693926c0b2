"""LLM backends registered through ``/add_llm_server``: announced to every node of the run as
``RUN/endpoints/infer-raas-<n>.json`` (the record rollout nodes already read), heartbeated while
the service runs.

Guarantees: a backend is announced only between ``/start`` and ``/stop`` (added while stopped it
is buffered, as ProRL does); ``/clear_llm_server`` removes every announcement at once, so nodes
stop sending new episodes there within one endpoint rescan (~1 s) and a checkpoint swap needs no
restart. An address is given with or without its ``/v1`` suffix; requests go to ``<base>/v1/...``.
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

from hpc.config.service import address_problem
from hpc.records import EndpointRecord, write_endpoint
from rollout_node.service.wire import WireError


def base_url(address: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port`` (the client appends ``/v1/completions``)."""
    if (why := address_problem(address)) is not None:
        raise WireError(400, why)
    url = address.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class Backends:
    """The registered backends and their endpoint files."""

    def __init__(self, endpoints_dir: Path) -> None:
        self.dir = endpoints_dir
        self.urls: list[str] = []
        self.announced = False
        self._beat = itertools.count(1)

    def _file(self, url: str) -> Path:
        return self.dir / f"infer-raas-{hashlib.blake2b(url.encode(), digest_size=6).hexdigest()}.json"

    def add(self, address: str) -> str:
        url = base_url(address)
        if url not in self.urls:
            self.urls.append(url)
        if self.announced:
            self._write(url)
        return url

    def clear(self) -> int:
        n = len(self.urls)
        self._remove_all()
        self.urls = []
        return n

    def announce(self) -> None:
        self.announced = True
        self.heartbeat()

    def withdraw(self) -> None:
        self.announced = False
        self._remove_all()

    def heartbeat(self) -> None:
        """Rewrite every file with a new counter (nodes judge liveness by its change)."""
        if self.announced:
            for url in self.urls:
                self._write(url)

    def _write(self, url: str) -> None:
        write_endpoint(self._file(url), EndpointRecord(role="infer", url=url, heartbeat=next(self._beat),
                                                       extra={"source": "rollout-server"}))

    def _remove_all(self) -> None:
        for path in self.dir.glob("infer-raas-*.json"):
            path.unlink(missing_ok=True)
