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

Why the tether (:func:`launcher_prefix`): ``--die-with-parent`` takes effect only once bwrap runs
its ``prctl``; a node SIGKILLed between its fork and that moment left the sandbox running under init
for good (found by scripts/soak.py). Root has a pids-cgroup sweep for that; an unprivileged node has
nothing. So every launcher first sets ``PR_SET_PDEATHSIG=SIGKILL`` itself (``setpriv --pdeathsig``,
util-linux >= 2.33, else a python shim) and then checks that its parent is still the node; if the
node died before, it exits (125) instead of starting the sandbox. The parent-death signal survives the
execs that follow (env, setsid, bwrap; none forks or is set-uid), so from the fork on the launcher
dies with the node, and with it the sandbox's pid namespace, daemons and signal-ignoring
double-forked processes included (the kernel kills a pid namespace whose init dies).
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


_TETHER_CHECK = 'test "$PPID" = "$0" && exec "$@"; exit 125'  # $0: the node's pid
_TETHER_SHIM = ("import ctypes,os,sys\n"
                "ctypes.CDLL(None).prctl(1, 9)\n"  # PR_SET_PDEATHSIG, SIGKILL
                "os.getppid() == int(sys.argv[1]) or sys.exit(125)\n"
                "os.execvp(sys.argv[2], sys.argv[2:])")


def _after_fork_in_child() -> None:
    # a forked child has no spawner thread (threads do not survive fork): start a fresh executor
    global _EXECUTOR
    _EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawner")


os.register_at_fork(after_in_child=_after_fork_in_child)


def spawn(fn: Callable[[], T]) -> T:
    """Run ``fn`` (which forks the launcher) on the spawner thread; returns or raises what it does."""
    return _EXECUTOR.submit(fn).result()


def launcher_prefix() -> list[str]:
    """The argv prefix of every sandbox launcher: the tether to this process (see the module
    docstring), then :func:`default_signals`."""
    return [*_tether(), str(os.getpid()), *default_signals()]


@functools.cache
def _tether() -> list[str]:
    """An argv prefix that, given the node's pid next, sets SIGKILL as the parent-death signal and
    execs the rest only while that pid is still the parent."""
    setpriv = shutil.which("setpriv")
    if setpriv and _runs([setpriv, "--pdeathsig", "KILL", "true"]):
        return [setpriv, "--pdeathsig", "KILL", "/bin/sh", "-c", _TETHER_CHECK]
    return [sys.executable, "-S", "-c", _TETHER_SHIM]


def _runs(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.cache
def default_signals() -> list[str]:
    """An argv prefix that execs the rest with every signal at its default disposition but
    :data:`WARNING_SIGNAL`, which is ignored."""
    env = shutil.which("env") or "/usr/bin/env"
    prefix = [env, "--default-signal", f"--ignore-signal={WARNING_SIGNAL}"]
    return prefix if _runs([*prefix, "true"]) else [sys.executable, "-S", "-c", _SHIM]
