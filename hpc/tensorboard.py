"""Optional TensorBoard export of a run's metrics (``spoolrl report RUN --tensorboard DIR``).

Writes one event file per process with every numeric field of its records as a scalar:
``train_step`` records by trainer step, everything else by seconds since the run's first record.
Uses the ``tensorboard`` package's own event writer (no torch needed on a login node); when
tensorboard is not installed the command says so and how to add it.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from hpc.errors import UsageError
from hpc.metrics import read_metrics

SKIP_FIELDS = ("t", "step", "process", "kind")


def scalars(records: list[dict[str, Any]]) -> dict[str, list[tuple[str, int, float, float]]]:
    """process -> [(tag, step, wall_time, value)] for every numeric field (pure)."""
    t0 = min((float(r["t"]) for r in records), default=0.0)
    out: dict[str, list[tuple[str, int, float, float]]] = defaultdict(list)
    for r in records:
        kind = str(r.get("kind"))
        step = int(r["step"]) if kind == "train_step" and isinstance(r.get("step"), int) else int(r["t"] - t0)
        for key, value in r.items():
            if key in SKIP_FIELDS or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            out[str(r.get("process"))].append((f"{kind}/{key}", step, float(r["t"]), float(value)))
    return dict(out)


def export_tensorboard(run_dir: Path, out_dir: Path) -> Path:
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as exc:
        raise UsageError("--tensorboard needs the tensorboard package: pip install tensorboard") from exc
    for process, points in scalars(list(read_metrics(run_dir))).items():
        writer = EventFileWriter(str(out_dir / process))
        for tag, step, wall, value in points:
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
            writer.add_event(Event(wall_time=wall, step=step, summary=summary))
        writer.close()
    return out_dir
