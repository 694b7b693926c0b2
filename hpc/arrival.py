"""How a consumer watches ``shards/ready``: cheap change detection and an arrival order of its own.

- :class:`ReadyWatch.changed`: one ``stat`` of the directory per poll; a listing only when its
  attributes changed, and once more ``SETTLE_S`` later on this process's monotonic clock, so a
  change hidden behind a coarse timestamp tick (1 s at the coarsest) is never missed.
- :class:`ReadyWatch.order`: shards are claimed in the order *this consumer first listed them*
  (then by the writer's own sequence number, then by name), never by the writers' wall clocks
  that open every shard id: a writer whose clock runs behind cannot jump the queue, and one whose
  clock runs ahead is not starved while others keep writing.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

SETTLE_S = 2.5  # longer than the coarsest directory timestamp tick of the filesystems we support
_SEQ = re.compile(r"-(\d+)-n\d+(?:\.shard)?$")


def writer_seq(name: str) -> int:
    """The writer's own shard counter in a shard name (0 when the name has none)."""
    m = _SEQ.search(name)
    return int(m.group(1)) if m else 0


class ReadyWatch:
    """Change detection and arrival order for one consumer's view of a ready directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._sig: tuple[int, ...] | None = None
        self._sig_seen = 0.0
        self._settled = False
        self._round = 0
        self._first_seen: dict[str, int] = {}

    def changed(self) -> bool:
        """False only when listing the directory cannot show anything new (one ``stat``)."""
        try:
            st = os.stat(self.directory)
        except OSError:
            return True
        sig = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_nlink, st.st_ino)
        now = time.monotonic()
        if sig != self._sig:
            self._sig, self._sig_seen, self._settled = sig, now, False
            return True
        if not self._settled and now - self._sig_seen >= SETTLE_S:
            self._settled = True
            return True
        return False

    def order(self, names: Iterable[str]) -> list[str]:
        """``names`` (one listing) in arrival order; forgets names no longer listed."""
        self._round += 1
        listed = set(names)
        seen = {n: self._first_seen.get(n, self._round) for n in listed}
        self._first_seen = seen
        return sorted(listed, key=lambda n: (seen[n], writer_seq(n), n))
