"""Which policy versions the inference servers hold: what the trainer's retention must not delete.

An inference node records, per server, in ``RUN/endpoints/``:
- ``infer-<host>-<i>.json`` (a server that is up): ``version`` (what it serves) and ``loading``
  (the version a reload in progress reads from disk, else null);
- ``loading-<host>-<i>.json`` while a server starts: ``{"role": "loading", "loading": v}``,
  removed once it is up or down.

:func:`versions_in_use` reads both. Files of a killed infer-node stay until its restart rewrites
them, so such a crash can keep at most one or two versions per server alive: disk, never a
deleted policy under a loading server.
"""

from __future__ import annotations

from pathlib import Path

from hpc.records import scan_endpoints

PIN_ROLES = ("infer", "loading")


def loading_pin(endpoints: Path, host: str, index: int) -> Path:
    return endpoints / f"loading-{host}-{index}.json"


def versions_in_use(endpoints: Path) -> set[int]:
    """Versions named by ``version`` or ``loading`` in the inference servers' endpoint and pin files."""
    used: set[int] = set()
    for _, rec in scan_endpoints(endpoints):  # one that vanished (atomic rename) is seen on the next pass
        if rec.role in PIN_ROLES:
            used.update(v for v in (rec.version, rec.loading) if v is not None)
    return used
