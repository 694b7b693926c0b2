"""A tiny INI parser: ``[section]`` headers, ``key = value`` pairs, full-line comments."""

from __future__ import annotations


def parse_ini(text: str) -> dict[str, dict[str, str]]:
    """Sections to their keys; keys before the first header go to the section ''."""
    sections: dict[str, dict[str, str]] = {}
    current = sections.setdefault("", {})
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1].strip(), {})
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"line {raw!r}: expected 'key = value'")
        current[key.strip()] = value.strip()
    return sections
