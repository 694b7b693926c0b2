"""A tiny CSV reader: quoted fields, custom separators, header rows."""

from __future__ import annotations


def parse_line(line: str, sep: str = ",") -> list[str]:
    """Split one line into fields; a field in double quotes may contain ``sep``."""
    fields: list[str] = []
    current: list[str] = []
    quoted = False
    i = 0
    while i < len(line):
        ch = line[i]
        if quoted:
            if ch == '"':
                quoted = False
            else:
                current.append(ch)
        elif ch == '"':
            quoted = True
        elif ch == sep:
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    fields.append("".join(current))
    return fields


def parse(text: str, sep: str = ",") -> list[list[str]]:
    """All rows of a CSV text."""
    return [parse_line(line, sep) for line in text.split("\n")]


def read_dicts(text: str, sep: str = ",") -> list[dict[str, str | None]]:
    """Rows as dicts keyed by the header row; missing trailing fields are None."""
    rows = parse(text, sep)
    header, body = rows[0], rows[1:]
    return [{name: row[i] for i, name in enumerate(header)} for row in body]
