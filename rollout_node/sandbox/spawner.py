"""All sandbox launchers are forked from one long-lived thread.

Why: bwrap's ``--die-with-parent`` (and apptainer's starter) use ``PR_SET_PDEATHSIG``, which
fires when the parent *thread* exits, not the parent process. A sandbox spawned from a short-lived
worker thread (a thread pool, a pipeline stage) would be SIGKILLed the moment that thread ends.
Forking from one daemon thread that lives as long as the node process ties every sandbox's life
to the node process, as intended.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawner")


def _after_fork_in_child() -> None:
    # a forked child has no spawner thread (threads do not survive fork): start a fresh executor
    global _EXECUTOR
    _EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawner")


os.register_at_fork(after_in_child=_after_fork_in_child)


def spawn(fn: Callable[[], T]) -> T:
    """Run ``fn`` (which forks the launcher) on the spawner thread; returns or raises what it does."""
    return _EXECUTOR.submit(fn).result()
