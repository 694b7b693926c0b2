"""Named fault points for crash tests: ``SPOOLRL_FAULT=point:count[,point:count]``.

At the ``count``-th time this process passes ``point``, it SIGKILLs itself (no cleanup, no
``finally``: exactly what a node failure looks like). Unset, a fault point costs one dict lookup.

Points in the trainer: ``step`` (between backward and the optimizer step), ``checkpoint`` (engine
state written, metadata not yet), ``after_checkpoint`` (LATEST flipped, spool not yet committed),
``publish`` (weights half written into the temporary policy directory).
"""

from __future__ import annotations

import os
import signal

_hits: dict[str, int] = {}


def _plan() -> dict[str, int]:
    spec = os.environ.get("SPOOLRL_FAULT", "")
    out = {}
    for item in filter(None, spec.split(",")):
        name, _, count = item.partition(":")
        out[name.strip()] = int(count or "1")
    return out


def fault_point(name: str) -> None:
    plan = _plan()
    if name not in plan:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == plan[name]:
        os.kill(os.getpid(), signal.SIGKILL)
