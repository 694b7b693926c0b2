"""The commented default config (``spoolrl config default``) and the README configuration reference.

Both are generated from the config dataclasses' field docs, so they cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, get_type_hints

import yaml

from hpc.config.base import iter_fields, to_dict, type_name

if TYPE_CHECKING:
    from hpc.config import RunConfig


def _scalar_yaml(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text.removesuffix("...").strip()  # PyYAML ends a lone scalar document with '...'


def _emit(obj: Any, indent: int, lines: list[str]) -> None:
    hints = get_type_hints(type(obj))
    pad = "  " * indent
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        doc = f.metadata.get("doc", "")
        safe = " [safe to change on resume]" if f.metadata.get("resumable") else ""
        if dataclasses.is_dataclass(value):
            lines.append(f"{pad}# {doc}")
            lines.append(f"{pad}{f.name}:")
            _emit(value, indent + 1, lines)
            continue
        lines.append(f"{pad}# {doc} ({type_name(hints[f.name])}){safe}")
        lines.append(f"{pad}{f.name}: {_scalar_yaml(to_dict(value))}")


def commented_yaml(config: RunConfig) -> str:
    """YAML for ``config`` with every key preceded by its documentation."""
    lines = ["# spoolrl run config. Every key is optional; the values shown are the defaults.",
             "# Validate with 'spoolrl validate --config run.yaml'; override with key=value on any command.", ""]
    _emit(config, 0, lines)
    return "\n".join(lines) + "\n"


def reference_markdown(cls: type) -> str:
    """A Markdown table of every key: dotted key, type, default, doc, safe on resume."""
    default = cls()
    rows = ["| key | type | default | meaning | resume |", "| --- | --- | --- | --- | --- |"]
    for key, f, tp in iter_fields(cls):
        value: Any = default
        for part in key.split("."):
            value = getattr(value, part)
        shown = _scalar_yaml(to_dict(value)).replace("|", "\\|")
        safe = "safe" if f.metadata.get("resumable") else ""
        rows.append(f"| `{key}` | {type_name(tp).replace('|', 'or')} | `{shown}` | {f.metadata.get('doc', '')} | {safe} |")
    return "\n".join(rows) + "\n"
