"""How a command travels to the agent's bash over the PTY: exactly, whatever its length, or not at all.

The PTY runs in canonical mode, whose line discipline keeps at most 4095 bytes of one line and
silently drops the rest (measured: ``printf %s <5,000 a's> | wc -c`` printed the truncated text with
status 0). So:
- a command of at most ``DIRECT_MAX_BYTES`` goes as is, inside one ``{ ...\\n}`` group (the fast
  path, no extra process);
- a longer one (up to ``MAX_COMMAND_BYTES``) goes base64-encoded in a quoted here-document of short
  lines, is decoded by ``base64 -d`` inside the sandbox and run by ``eval`` in the same shell (cwd
  and environment persist as for a short command). A random end tag is appended before encoding
  and checked before ``eval``: a command that did not arrive whole (no ``base64`` in the image, a
  full /tmp for the here-document, an alias the agent defined) runs nothing and reports status 126
  with a message, never a partial command with a success status;
- a longer one still, or one containing a NUL byte (bash drops those), is refused: the tool
  returns an error result and nothing is sent.
Caveat of the long path: ``$?`` at its start is the decoder's status, not the previous command's.
"""

from __future__ import annotations

import base64
import secrets

DIRECT_MAX_BYTES = 2048        # well under the 4095-byte canonical line limit
MAX_COMMAND_BYTES = 256 * 1024  # the documented limit of one bash tool call (UTF-8 bytes; ~0.1 s to send)
LINE = 76                      # base64 line width (each line far below the canonical limit)
VAR = "__spoolrl_cmd"


class CommandRefused(ValueError):
    """The command cannot be sent exactly; the message is for the agent."""


def frame(command: str) -> bytes:
    """The bytes to type into the shell so that it runs exactly ``command``. Raises CommandRefused."""
    data = command.encode("utf-8", "surrogateescape")
    if b"\0" in data:
        raise CommandRefused("the command contains a NUL byte, which bash cannot receive; nothing was run")
    if len(data) > MAX_COMMAND_BYTES:
        raise CommandRefused(f"the command is {len(data)} bytes, over the limit of {MAX_COMMAND_BYTES} bytes "
                             "of one bash call; nothing was run (write long content with the file tools, "
                             "or in several commands)")
    if len(data) <= DIRECT_MAX_BYTES:
        return b"{ " + data + b"\n}\n"
    return _encoded(data)


def _encoded(data: bytes) -> bytes:
    token = secrets.token_hex(8)
    tag, eof = f"spoolrl-end-{token}", f"__SPOOLRL_EOF_{token}"
    payload = base64.b64encode(data + b"\n" + tag.encode()).decode()
    lines = "\n".join(payload[i:i + LINE] for i in range(0, len(payload), LINE))
    refuse = (f"printf 'spoolrl: the command ({len(data)} bytes) did not arrive intact; nothing was run\\n' >&2; "
              "(exit 126)")
    text = (f"{{ {VAR}=$(base64 -d <<'{eof}'\n{lines}\n{eof}\n); "
            f"case ${VAR} in *{tag}) eval \"${{{VAR}%{tag}}}\";; *) {refuse};; esac\n}}\n")
    return text.encode()
