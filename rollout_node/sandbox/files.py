"""The agent's file tools: view (numbered lines), create, exact string replace, insert.

They run on the node, directly on the episode's work dir (no sandbox round trip), and are safe
against a hostile work dir: every path component is opened relative to an already-opened
directory with ``O_NOFOLLOW``; symlinks are resolved by this module *as they would resolve
inside the sandbox* and refused when they lead out of ``/work``; only regular files are read or
written (a FIFO or device cannot block or leak). Paths are sandbox paths: absolute under the
work dir's inside path (``/work``) or relative to it. Every call returns a
:class:`ToolResult` (exit_code 0 on success, 1 with a message otherwise); none raises.
"""

from __future__ import annotations

import os
import posixpath
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rollout_node.sandbox.result import HeadTail, ToolResult, make_result

MAX_READ_BYTES = 16 * 2**20
MAX_SYMLINK_HOPS = 40
SNIPPET_LINES = 4


class ToolUsageError(Exception):
    """The agent asked for something impossible; becomes an exit_code-1 result."""


class FileTools:
    def __init__(self, workdir: Path, inside: str, keep: int, max_file_bytes: int) -> None:
        self.workdir, self.inside, self.keep, self.max_file_bytes = workdir, inside.rstrip("/"), keep, max_file_bytes

    # ---------------------------------------------------------------- public tools
    def view(self, path: str, view_range: tuple[int, int] | None = None) -> ToolResult:
        return self._tool(self._view, path, view_range)

    def create(self, path: str, text: str, *, overwrite: bool = False) -> ToolResult:
        return self._tool(self._create, path, text, overwrite)

    def str_replace(self, path: str, old: str, new: str) -> ToolResult:
        return self._tool(self._str_replace, path, old, new)

    def insert(self, path: str, line: int, text: str) -> ToolResult:
        return self._tool(self._insert, path, line, text)

    def _tool(self, fn, *args) -> ToolResult:  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        buf = HeadTail(self.keep)
        try:
            buf.add(fn(*args).encode(errors="surrogateescape"))
            code = 0
        except ToolUsageError as exc:
            buf.add(f"error: {exc}\n".encode(errors="surrogateescape"))
            code = 1
        except OSError as exc:
            buf.add(f"error: {args[0]}: {exc.strerror or exc}\n".encode())
            code = 1
        return make_result(buf, code, time.monotonic() - t0)

    # ---------------------------------------------------------------- implementations
    def _view(self, path: str, view_range: tuple[int, int] | None) -> str:
        with self._open_parent(path) as (dfd, name):
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False) if name else os.fstat(dfd)
            if stat.S_ISDIR(st.st_mode):
                return self._listing(dfd, name)
            lines = self._read(dfd, name).split("\n")
        start, end = view_range or (1, -1)
        end = len(lines) if end == -1 else end
        if not 1 <= start <= max(1, len(lines)) or end < start:
            raise ToolUsageError(f"view_range {view_range} is outside the file's {len(lines)} lines")
        return "".join(f"{n:6}\t{lines[n - 1]}\n" for n in range(start, min(end, len(lines)) + 1))

    def _listing(self, dfd: int, name: str) -> str:
        fd = os.open(name or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
        try:
            entries = sorted(e for e in os.listdir(fd) if not e.startswith("."))
            kinds = [e + ("/" if stat.S_ISDIR(os.stat(e, dir_fd=fd, follow_symlinks=False).st_mode) else "")
                     for e in entries]
        finally:
            os.close(fd)
        return "".join(k + "\n" for k in kinds)

    def _create(self, path: str, text: str, overwrite: bool) -> str:
        data = text.encode(errors="surrogateescape")
        if len(data) > self.max_file_bytes:
            raise ToolUsageError(f"{len(data)} bytes exceed the file size limit")
        with self._open_parent(path, make_dirs=True) as (dfd, name):
            if not name:
                raise ToolUsageError(f"{path} is a directory")
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
            if not overwrite:
                flags |= os.O_EXCL
            try:
                fd = os.open(name, flags, 0o644, dir_fd=dfd)
            except FileExistsError:
                raise ToolUsageError(f"{path} exists; use str_replace or insert to change it") from None
            self._write_fd(fd, data)
        return f"created {path} ({len(data)} bytes)\n"

    def _str_replace(self, path: str, old: str, new: str) -> str:
        if not old:
            raise ToolUsageError("old_str is empty")
        with self._open_parent(path) as (dfd, name):
            text = self._read(dfd, name)
            count = text.count(old)
            if count != 1:
                where = [str(text[:i].count("\n") + 1) for i in _find_all(text, old)][:10]
                raise ToolUsageError(f"old_str occurs {count} times in {path}" +
                                     (f" (lines {', '.join(where)}); make it unique" if count else ""))
            at = text.index(old)
            text = text[:at] + new + text[at + len(old):]
            self._write(dfd, name, text)
        first = text[:at].count("\n") + 1
        return f"edited {path}\n" + _snippet(text, first, first + new.count("\n"))

    def _insert(self, path: str, line: int, new: str) -> str:
        with self._open_parent(path) as (dfd, name):
            lines = self._read(dfd, name).split("\n")
            if not 0 <= line <= len(lines):
                raise ToolUsageError(f"insert line {line} is outside 0..{len(lines)}")
            added = new.rstrip("\n").split("\n")
            lines[line:line] = added
            text = "\n".join(lines)
            self._write(dfd, name, text)
        return f"inserted {len(added)} line(s) into {path}\n" + _snippet(text, line + 1, line + len(added))

    # ---------------------------------------------------------------- safe I/O
    def _read(self, dfd: int, name: str) -> str:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ToolUsageError(f"{name} is not a regular file")
            if st.st_size > MAX_READ_BYTES:
                raise ToolUsageError(f"{name} has {st.st_size} bytes; view it with bash (head, sed -n)")
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read().decode(errors="surrogateescape")
        finally:
            os.close(fd)

    def _write(self, dfd: int, name: str, text: str) -> None:
        data = text.encode(errors="surrogateescape")
        if len(data) > self.max_file_bytes:
            raise ToolUsageError(f"{len(data)} bytes exceed the file size limit")
        fd = os.open(name, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        self._write_fd(fd, data)

    @staticmethod
    def _write_fd(fd: int, data: bytes) -> None:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ToolUsageError("not a regular file")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)

    @contextmanager
    def _open_parent(self, path: str, *, make_dirs: bool = False) -> Iterator[tuple[int, str]]:
        """Yield (fd of the parent directory, final name) of ``path`` resolved inside /work."""
        parts = self._relative_parts(path)
        resolved: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                if not resolved:
                    raise ToolUsageError(f"{path} leads outside {self.inside}")
                resolved.pop()
                continue
            dfd = self._walk(resolved)
            try:
                st = os.stat(part, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                if parts and make_dirs:
                    os.mkdir(part, 0o755, dir_fd=dfd)
                    st = os.stat(part, dir_fd=dfd, follow_symlinks=False)
                elif parts:
                    os.close(dfd)
                    raise ToolUsageError(f"{path}: no such directory {part!r}") from None
                else:
                    st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                hops += 1
                target = os.readlink(part, dir_fd=dfd)
                os.close(dfd)
                if hops > MAX_SYMLINK_HOPS:
                    raise ToolUsageError(f"{path}: too many symlinks")
                if target.startswith("/"):
                    resolved, parts = [], self._relative_parts(target) + parts
                else:
                    parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                continue
            os.close(dfd)
            resolved.append(part)
        name = resolved.pop() if resolved else ""
        dfd = self._walk(resolved)
        try:
            yield dfd, name
        finally:
            os.close(dfd)

    def _walk(self, names: list[str]) -> int:
        fd = os.open(self.workdir, os.O_RDONLY | os.O_DIRECTORY)
        for name in names:
            try:
                nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            finally:
                os.close(fd)
            fd = nfd
        return fd

    def _relative_parts(self, path: str) -> list[str]:
        norm = posixpath.normpath(path if path.startswith("/") else posixpath.join(self.inside, path))
        if norm != self.inside and not norm.startswith(self.inside + "/"):
            raise ToolUsageError(f"{path} is outside {self.inside}; the file tools work on the work dir only")
        return [p for p in norm[len(self.inside):].split("/") if p]


def _find_all(text: str, sub: str) -> Iterator[int]:
    i = text.find(sub)
    while i >= 0:
        yield i
        i = text.find(sub, i + 1)


def _snippet(text: str, first: int, last: int) -> str:
    lines = text.split("\n")
    lo, hi = max(1, first - SNIPPET_LINES), min(len(lines), last + SNIPPET_LINES)
    return "".join(f"{n:6}\t{lines[n - 1]}\n" for n in range(lo, hi + 1))
