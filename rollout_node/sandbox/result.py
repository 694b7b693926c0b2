"""The frozen result of every tool call, and the bounded buffer that produces it.

Guarantees: a tool call never returns more than ``2 * keep`` bytes of output however much the
command printed; the first and last ``keep`` bytes are kept, everything is counted in
``total_bytes``, and ``truncated`` says whether anything was dropped. Nothing here raises for
anything the agent did.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

TRUNCATION_NOTE = "\n...[{dropped} bytes truncated]...\n"


@dataclass(frozen=True)
class ToolResult:
    """What one tool call produced. ``exit_code`` is None when there is none (killed, tool error)."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    total_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class HeadTail:
    """Keeps the first and the last ``keep`` bytes of a stream and counts all of it."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.keep:  # trim rarely: amortised O(1) per byte
                del self.tail[: len(self.tail) - self.keep]

    @property
    def truncated(self) -> bool:
        return self.total - len(self.head) > self.keep

    def text(self) -> str:
        tail = bytes(self.tail[-self.keep:]) if self.tail else b""
        if not self.truncated:
            return (bytes(self.head) + tail).decode(errors="replace")
        dropped = self.total - len(self.head) - len(tail)
        note = TRUNCATION_NOTE.format(dropped=dropped)
        return bytes(self.head).decode(errors="replace") + note + tail.decode(errors="replace")


def make_result(buf: HeadTail, exit_code: int | None, duration_s: float, *, timed_out: bool = False,
                note: str = "") -> ToolResult:
    """Build the frozen result; ``note`` (a line from the tool itself, e.g. a restart) is appended."""
    text = buf.text()
    if note:
        text += ("" if not text or text.endswith("\n") else "\n") + f"[spoolrl: {note}]\n"
    return ToolResult(output=text, exit_code=exit_code, timed_out=timed_out, truncated=buf.truncated,
                      duration_s=round(duration_s, 6), total_bytes=buf.total)


def error_result(message: str, duration_s: float = 0.0) -> ToolResult:
    """A tool-level failure the agent should see (bad path, server gone), not an exception."""
    data = message.encode()
    return ToolResult(output=message, exit_code=None, duration_s=round(duration_s, 6), total_bytes=len(data))
