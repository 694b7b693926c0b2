"""Process trees as Slurm's proctrack/linuxproc sees them: it signals a step's processes deepest first,
so a role's children hear a SIGTERM or the time-limit warning before the role does."""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def deepest_first(pid: int) -> list[int]:
    """``pid``'s tree in the order linuxproc signals it: every child's subtree first, then ``pid``."""
    return [p for child in children(pid) for p in deepest_first(child)] + [pid]


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid`` or of process group ``sid``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and sid in (int(fields[2]), int(fields[3])):
            out.append(int(stat.parent.name))
    return out
