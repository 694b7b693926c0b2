"""Per-process metrics as JSON lines: ``RUN/metrics/<process>.jsonl``.

One file per process, because appends from many nodes to one file interleave on network
filesystems. Each line is one JSON object (a record)::

    {"t": 1764400000.123,      # unix time (float seconds) when the record was written
     "kind": "train_step",     # what the record describes; the producer's name for it
     "process": "trainer-0",   # the process name given to MetricsWriter (also the file name)
     ...}                      # any further JSON fields of that kind (numbers, strings, lists, dicts)

``t``, ``kind`` and ``process`` are always present and cannot be overridden by fields. Values
that JSON cannot encode are written with ``str()``. Each record is written with one ``write`` of
a whole line and flushed, so a crash can leave at most a torn last line, which
:func:`read_metrics` skips.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from hpc.fsutil import safe_name
from hpc.paths import RunPaths

RESERVED = ("t", "kind", "process")


class MetricsWriter:
    """Appends records to ``RUN/metrics/<process>.jsonl`` (see the module docstring for the schema)."""

    def __init__(self, run_dir: str | os.PathLike[str], process_name: str) -> None:
        self.process = process_name
        directory = RunPaths(Path(run_dir)).metrics
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{safe_name(process_name)}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(self, kind: str, **fields: Any) -> None:
        clash = [k for k in fields if k in RESERVED]
        if clash:
            raise ValueError(f"MetricsWriter.log: field names {clash} are reserved ({', '.join(RESERVED)})")
        record = {"t": time.time(), "kind": kind, "process": self.process, **fields}
        line = json.dumps(record, default=str, separators=(",", ":")) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def read_metrics(run_dir: str | os.PathLike[str], kind: str | None = None) -> Iterator[dict[str, Any]]:
    """Every record of every process file (optionally of one ``kind``); torn or bad lines are skipped."""
    directory = RunPaths(Path(run_dir)).metrics
    for path in sorted(directory.glob("*.jsonl")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn last line of a crashed writer
            if isinstance(record, dict) and (kind is None or record.get("kind") == kind):
                yield record
