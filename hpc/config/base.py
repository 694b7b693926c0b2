"""Typed config machinery: frozen keyword-only dataclasses built from plain mappings.

Guarantees:
- Building is pure: no I/O, no mutation of the input. Every problem is collected (not only the
  first) and names the dotted key, the bad value and the fix.
- Unknown keys at any depth are errors that list the valid keys of that section.
- Every number is finite (NaN and infinities are refused: a NaN passes every range check) and
  every string is one line of text without control characters (tab allowed): values end up in
  batch scripts, sbatch lines and log records, where a newline would start new shell code.
- Bad values are shown shortened (``reprlib``), so a YAML alias bomb cannot blow up a message.
- Field documentation lives in the field (``knob(doc=...)``); the commented default config and
  the README configuration reference are generated from it.
"""

from __future__ import annotations

import dataclasses
import math
import re
import reprlib
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # pragma: no cover - Python 3.10
    from typing_extensions import dataclass_transform

T = TypeVar("T")
_EXPONENT_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
MISSING = dataclasses.MISSING
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = 80
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict = 3, 8, 8


def show(value: Any) -> str:
    """A bounded repr of a user value for messages (cost independent of the value's expanded size)."""
    return _SHOW.repr(value)


def knob(
    default: Any = MISSING,
    *,
    doc: str,
    min: float | None = None,  # noqa: A002 - reads naturally at call sites
    max: float | None = None,  # noqa: A002
    factory: Any = MISSING,
    resumable: bool = False,
) -> Any:
    """A documented config field. ``resumable=True``: safe to change when resuming a run."""
    meta = {"doc": doc, "min": min, "max": max, "resumable": resumable}
    if factory is not MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(dataclasses.field,))
def section(cls: type[T]) -> type[T]:
    """Decorator: a frozen, keyword-only config dataclass."""
    return dataclasses.dataclass(frozen=True, kw_only=True)(cls)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in get_args(tp))}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, key: str, problems: list[str]) -> Any:
    """Check ``value`` against ``tp``; returns the converted value or None after recording a problem."""
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            problems.append(f"{key}: expected a mapping (section), got {show(value)}; write it as 'key: value' lines")
            return None
        return build(typing.cast(type, tp), value, key, problems)
    if origin is Literal:
        if value in get_args(tp):
            return value
        problems.append(f"{key}: {show(value)} is not one of {', '.join(repr(a) for a in get_args(tp))}")
        return None
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            problems.append(f"{key}: null is not allowed; give a {_type_name(tp)}")
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(inner[0], value, key, problems)
        for a in inner:
            trial: list[str] = []
            out = _convert(a, value, key, trial)
            if not trial:
                return out
        problems.append(f"{key}: {show(value)} is not a {_type_name(tp)}")
        return None
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            problems.append(f"{key}: expected a list, got {show(value)}; write it as [a, b] or '- a' lines")
            return None
        (item_tp, *_rest) = get_args(tp) or (Any,)
        items = [_convert(item_tp, v, f"{key}[{i}]", problems) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            problems.append(f"{key}: expected a mapping, got {show(value)}")
            return None
        _k, val_tp = get_args(tp)
        return {str(k): _convert(val_tp, v, _join(key, str(k)), problems) for k, v in value.items()}
    return _scalar(tp, value, key, problems)


def _scalar(tp: Any, value: Any, key: str, problems: list[str]) -> Any:
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        problems.append(f"{key}: expected true or false, got {show(value)}")
        return None
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        problems.append(f"{key}: expected an integer, got {show(value)}")
        return None
    if tp is float:
        number = _number(value)
        if number is not None and math.isfinite(number):
            return number
        problems.append(f"{key}: expected a finite number, got {show(value)}" if number is not None else
                        f"{key}: expected a number, got {show(value)}")
        return None
    if tp is str:
        if isinstance(value, str):
            if (why := control_problem(key, value)) is not None:
                problems.append(why)
                return None
            return value
        problems.append(f"{key}: expected a string, got {show(value)}; quote it if it looks like a number")
        return None
    raise TypeError(f"unsupported config type {tp!r} at {key}")  # a bug in a config class


def control_problem(key: str, text: str) -> str | None:
    """The refusal of a value with a control character (tab allowed), or None when it has none."""
    if (bad := _CONTROL.search(text)) is None:
        return None
    return (f"{key}: {show(text)} contains the control character {bad.group()!r} at position {bad.start()}; "
            "give one line of plain text (values are written into batch scripts)")


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an int beyond float range
            return math.inf
    if isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(value.strip()):
        return float(value)  # YAML 1.1 reads '1e-5' (no dot) as a string; users mean a number
    return None


def _check_range(f: dataclasses.Field[Any], value: Any, key: str, problems: list[str]) -> None:
    lo, hi = f.metadata.get("min"), f.metadata.get("max")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    if lo is not None and value < lo:
        problems.append(f"{key}: {show(value)} is below the minimum {lo}; set it to at least {lo}")
    if hi is not None and value > hi:
        problems.append(f"{key}: {show(value)} is above the maximum {hi}; set it to at most {hi}")


def build(cls: type[T], data: Mapping[str, Any], prefix: str, problems: list[str]) -> T:
    """Build section ``cls`` from ``data``, appending problems (dotted keys) instead of raising."""
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    n_before = len(problems)
    for name in data:
        if name not in fields:
            valid = ", ".join(sorted(fields))
            problems.append(f"{_join(prefix, str(name))}: unknown key; valid keys here: {valid}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key = _join(prefix, name)
        if name in data:
            raw = data[name]
            if dataclasses.is_dataclass(hints[name]) and f.default_factory is not MISSING and isinstance(raw, Mapping):
                raw = _deep_merge(to_dict(f.default_factory()), raw)  # a partial section keeps the parent's defaults
            value = _convert(hints[name], raw, key, problems)
            _check_range(f, value, key, problems)
            kwargs[name] = value
        elif f.default is MISSING and f.default_factory is MISSING:
            problems.append(f"{key}: required; add '{name}: <{_type_name(hints[name])}>' ({f.metadata.get('doc', '')})")
    try:
        obj = cls(**{k: v for k, v in kwargs.items()})
    except TypeError:
        obj = _placeholder(cls)
    if len(problems) == n_before:
        for p in getattr(obj, "check", lambda: [])():
            problems.append(_join(prefix, p) if prefix else p)
    return obj


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, Mapping) else v
    return out


def _placeholder(cls: type[T]) -> T:
    """An instance with defaults only, so that collecting problems can continue after a failure."""
    return typing.cast(T, object.__new__(cls))


def to_dict(obj: Any) -> Any:
    """Plain data (dicts, lists, scalars) for YAML/JSON output."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def iter_fields(cls: type, prefix: str = "") -> typing.Iterator[tuple[str, dataclasses.Field[Any], Any]]:
    """Yield (dotted key, field, type) for every leaf field, depth first, in declaration order."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = _join(prefix, f.name)
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from iter_fields(tp, key)  # type: ignore[arg-type]
        else:
            yield key, f, tp


def type_name(tp: Any) -> str:
    return _type_name(tp)
