"""All sandbox launchers are forked from one long-lived thread, with default signal dispositions.

Why one thread: bwrap's ``--die-with-parent`` (and apptainer's starter) use ``PR_SET_PDEATHSIG``,
which fires when the parent *thread* exits, not the parent process. A sandbox spawned from a
short-lived worker thread (a thread pool, a pipeline stage) would be SIGKILLed the moment that
thread ends. Forking from one daemon thread that lives as long as the node process ties every
sandbox's life to the node process, as intended.

Why the signal reset: an ignored signal (``SIG_IGN``) survives ``exec``. A node started in the
background of a script (``nohup ... &``: SIGINT and SIGQUIT ignored) would hand that to bash in the
sandbox and to every command it runs, so Ctrl-C could never interrupt a timed-out command.
``subprocess`` restores only SIGPIPE/SIGXFZ/SIGXFSZ, and a ``preexec_fn`` would cost vfork, so every
launcher argv starts with :func:`default_signals`: ``env --default-signal`` (coreutils >= 8.31),
else a two-line python shim doing the same.

One exception, SIGUSR1, is ignored in sandboxes: it is Slurm's time-limit warning
(``--signal=USR1@drain_s``), sent to every process of the rollout step, deepest first. It is the
node's cue to drain (let the groups in flight finish); at its default disposition it would kill the
sandboxes first, and an EVAL runner killed by it wrote a correct patch as reward 0.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawner")
WARNING_SIGNAL = "USR1"  # Slurm's time-limit warning (sbatch_templates/): the node's, not the sandbox's
_SHIM = ("import os,signal,sys\n"
         "for s in signal.valid_signals():\n"
         "    try: signal.signal(s, signal.SIG_DFL)\n"
         "    except (OSError, ValueError): pass\n"
         f"signal.signal(signal.SIG{WARNING_SIGNAL}, signal.SIG_IGN)\n"
         "os.execvp(sys.argv[1], sys.argv[1:])")


def _after_fork_in_child() -> None:
    # a forked child has no spawner thread (threads do not survive fork): start a fresh executor
    global _EXECUTOR
    _EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawner")


os.register_at_fork(after_in_child=_after_fork_in_child)


def spawn(fn: Callable[[], T]) -> T:
    """Run ``fn`` (which forks the launcher) on the spawner thread; returns or raises what it does."""
    return _EXECUTOR.submit(fn).result()


@functools.cache
def default_signals() -> list[str]:
    """An argv prefix that execs the rest with every signal at its default disposition but
    :data:`WARNING_SIGNAL`, which is ignored."""
    env = shutil.which("env") or "/usr/bin/env"
    prefix = [env, "--default-signal", f"--ignore-signal={WARNING_SIGNAL}"]
    try:
        ok = subprocess.run([*prefix, "true"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return prefix if ok else [sys.executable, "-S", "-c", _SHIM]
