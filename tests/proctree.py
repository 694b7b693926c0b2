"""Process trees as Slurm's proctrack/linuxproc sees them: it signals a step's processes deepest first,
so a role's children hear a SIGTERM or the time-limit warning before the role does."""

from __future__ import annotations

from pathlib import Path


def _stats() -> list[tuple[int, list[str]]]:
    """Every live process's pid and the fields of its /proc stat after the command name (state, ppid, pgrp,
    session, ...)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            out.append((int(stat.parent.name), stat.read_text().rsplit(")", 1)[1].split()))
        except OSError:
            continue
    return out


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (from /proc)."""
    return [p for p, fields in _stats() if int(fields[1]) == pid]


def deepest_first(pid: int) -> list[int]:
    """``pid``'s tree in the order linuxproc signals it: every child's subtree first, then ``pid``."""
    return [p for child in children(pid) for p in deepest_first(child)] + [pid]


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid`` or of process group ``sid``."""
    return [p for p, fields in _stats() if fields[0] != "Z" and sid in (int(fields[2]), int(fields[3]))]
