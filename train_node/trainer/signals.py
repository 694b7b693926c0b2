"""Preemption signals: checkpoint, then exit so that the launcher requeues the job.

Slurm sends its early warning as SIGUSR1 (``--signal=B:USR1@<s>``, forwarded by the batch script to
the train step) and a bare SIGTERM on ``scancel``/``scontrol requeue``/preemption (SIGINT, Ctrl-C on a
local run, is treated the same). Each one only
sets a flag here; the train loop notices it after the current step, writes a checkpoint (and
commits the spool), waits for the policy writer and exits with :data:`EXIT_REQUEUE`.

Exit status contract: ``0`` = finished (total steps, data exhausted, or STOP marker drained);
``75`` (``EX_TEMPFAIL``) = stopped by a signal after a complete checkpoint: requeue me and I continue
from it; anything else = failed.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

EXIT_REQUEUE = 75
HANDLED = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)  # SIGINT: Ctrl-C on `spoolrl demo` reaches every role


class StopFlag:
    """Set by the handlers (or by code); read by the loop once per step."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name = ""

    def set(self, name: str) -> None:
        self.signal_name = self.signal_name or name
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


def install(flag: StopFlag) -> dict[int, object]:
    """Install the handlers (main thread only); returns the previous ones for ``restore``."""
    previous: dict[int, object] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous

    def handler(signum: int, _frame: FrameType | None) -> None:
        flag.set(signal.Signals(signum).name)

    for sig in HANDLED:
        previous[sig] = signal.signal(sig, handler)
    return previous


def restore(previous: dict[int, object]) -> None:
    for sig, old in previous.items():
        signal.signal(sig, old)  # type: ignore[arg-type]
