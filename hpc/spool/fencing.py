"""Consumer fencing generations under ``RUN/control/fence/``: a newer trainer makes every older
one stale, and a stale one is refused before it changes anything shared.

``fence`` publishes ``<generation>`` (8 digits) with a no-replace link, so of two trainers fencing
at once exactly one gets each number. ``check`` compares the generation an object holds with
the newest one (one listing); there is no lock spanning a check and the change that follows it,
so a trainer fenced in that instant can still make that one change (see :mod:`hpc.spool`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from hpc.errors import FencedError
from hpc.fsutil import listdir, publish_file, visible


class Fencing:
    """The generations of one spool object's consumers (held by :class:`hpc.spool.Spool`)."""

    def __init__(self, fence_dir: Path) -> None:
        self.fence_dir = fence_dir
        self._generation: dict[str, int] = {}

    def fence(self, consumer_id: str) -> int:
        """Become the newest consumer generation; older ones can no longer commit. Returns it."""
        while True:
            generation = self.current() + 1
            record = {"consumer": consumer_id, "host": socket.gethostname(), "pid": os.getpid(), "t": time.time()}
            if publish_file(self.fence_dir / f"{generation:08d}", json.dumps(record).encode()):
                self._generation[consumer_id] = generation
                return generation

    def current(self) -> int:
        """The newest generation (0 before any consumer fenced)."""
        gens = [int(n) for n in visible(listdir(self.fence_dir)) if n.isdigit()]
        return max(gens, default=0)

    def held(self, consumer_id: str) -> int:
        """The generation this object holds for ``consumer_id``. An object that never fenced adopts
        the current generation when ``consumer_id`` is the one that fenced it (a helper process of
        the current trainer); a stale object keeps the generation it fenced, and is refused."""
        if consumer_id not in self._generation:
            current = self.current()
            try:
                owner = json.loads((self.fence_dir / f"{current:08d}").read_bytes())["consumer"] if current else None
            except (OSError, ValueError, KeyError):
                owner = None
            self._generation[consumer_id] = current if owner == consumer_id else 0
        return self._generation[consumer_id]

    def check(self, consumer_id: str) -> int:
        """The generation ``consumer_id`` holds; FencedError when a newer one exists."""
        mine, current = self.held(consumer_id), self.current()
        if mine != current:
            raise FencedError(f"consumer {consumer_id!r} holds generation {mine} but generation {current} "
                              f"exists (a newer trainer started): stop this process; its work is recovered "
                              f"by the newer one")
        return mine
