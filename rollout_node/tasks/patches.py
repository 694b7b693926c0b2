"""Reading unified / git diffs: which paths a patch touches.

Guarantees: :func:`patch_paths` returns every old and new path named by ``diff --git``, ``---``/
``+++``, ``rename``/``copy`` headers (git's C-style quoting undone, ``a/``/``b/`` prefixes and
``/dev/null`` dropped), in first-seen order without duplicates. It never raises on odd input.
"""

from __future__ import annotations

import re

_DIFF_GIT = re.compile(r'^diff --git (?P<a>"(?:[^"\\]|\\.)*"|\S+) (?P<b>"(?:[^"\\]|\\.)*"|\S+)$')
_HEADER = re.compile(r"^(?:--- |\+\+\+ |rename from |rename to |copy from |copy to )(?P<p>.+?)(?:\t.*)?$")
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "r": "\r", "v": "\v"}


def unquote(path: str) -> str:
    """Undo git's C-style quoting (``"a/sp\\303\\251cial"`` -> ``a/spécial``)."""
    if not (len(path) >= 2 and path.startswith('"') and path.endswith('"')):
        return path
    body, out, i = path[1:-1], bytearray(), 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and re.match(r"[0-7]{3}", body[i + 1:i + 4]):
                out.append(int(body[i + 1:i + 4], 8))
                i += 4
                continue
            out += _ESCAPES.get(nxt, nxt).encode()
            i += 2
            continue
        out += ch.encode()
        i += 1
    return out.decode("utf-8", errors="surrogateescape")


def _strip(path: str, rename: bool) -> str | None:
    path = unquote(path.strip())
    if path == "/dev/null":
        return None
    if not rename and (path.startswith("a/") or path.startswith("b/")):
        path = path[2:]
    return path or None


def patch_paths(diff: str) -> list[str]:
    """Every path the patch reads or writes (repository-relative)."""
    seen: dict[str, None] = {}
    lines = diff.splitlines()
    for i, line in enumerate(lines):
        m = _DIFF_GIT.match(line)
        if m:
            for key in ("a", "b"):
                p = _strip(m[key], False)
                if p:
                    seen.setdefault(p, None)
            continue
        h = _HEADER.match(line)
        if h and not _is_file_header(lines, i):
            continue
        if h:
            p = _strip(h["p"], line.startswith(("rename", "copy")))
            if p:
                seen.setdefault(p, None)
    return list(seen)


def _is_file_header(lines: list[str], i: int) -> bool:
    """``---``/``+++`` are headers only as a pair (a removed line ``-- x`` inside a hunk is not)."""
    line = lines[i]
    if line.startswith("--- "):
        return i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
    if line.startswith("+++ "):
        return i > 0 and lines[i - 1].startswith("--- ")
    return True


def added_lines(diff: str) -> dict[str, list[str]]:
    """Path (new side) -> the lines the patch adds to it (binary patches contribute nothing)."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    lines = diff.splitlines()
    for i, line in enumerate(lines):
        m = _DIFF_GIT.match(line)
        if m:
            current = _strip(m["b"], False)
            continue
        if line.startswith("+++ ") and _is_file_header(lines, i):
            current = _strip(line[4:].split("\t")[0], False) or current
            continue
        if current and line.startswith("+") and not line.startswith("+++ "):
            out.setdefault(current, []).append(line[1:])
    return out
