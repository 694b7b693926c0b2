"""The one small exception hierarchy for everything a user can cause.

Rules (STYLE.md 4): exceptions from here for user-caused and infrastructure faults; ``assert``
only for internal invariants. Infrastructure errors chain their cause (``raise ... from exc``)
and say what to do next. The CLI maps :class:`SpoolrlError` to a one-line message and an exit
status (:attr:`SpoolrlError.exit_code`) instead of a traceback.
"""

from __future__ import annotations


class SpoolrlError(Exception):
    """Base of every error spoolrl raises on purpose; the CLI prints it without a traceback."""

    exit_code = 1


class ConfigError(SpoolrlError):
    """A run config is wrong. Raised before anything is created on disk; exit status 2."""

    exit_code = 2

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid config ({len(self.problems)} problem(s)):\n{lines}")


class UsageError(SpoolrlError):
    """A command was called wrongly (missing file, bad argument); exit status 2."""

    exit_code = 2


class RunDirError(SpoolrlError):
    """A run directory is missing, of another layout version, or does not match the config."""

    exit_code = 2


class RecordError(RunDirError):
    """A record in the run directory (a LATEST pointer, an endpoint or task record) is not what its
    reader expects; the message names the file and the problem (see :mod:`hpc.records`)."""


class SpoolError(SpoolrlError):
    """The spool cannot proceed (disk full, quota, permissions, fencing)."""


class FencedError(SpoolError):
    """A consumer with a newer fencing generation exists; this (stale) consumer must stop."""


class CorruptShardError(SpoolError):
    """A shard failed its checksum or could not be decoded; it is quarantined, never fatal."""


class SandboxError(SpoolrlError):
    """A sandbox runtime could not start or broke (infrastructure, not the agent's fault)."""


class InferenceError(SpoolrlError):
    """No inference server could answer within the retry budget."""


class SlurmError(SpoolrlError):
    """Slurm refused or failed a request (sbatch, sacct, scancel)."""
