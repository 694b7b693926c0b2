"""The records the roles exchange through the run directory: one typed reader/writer each.

Every process that reads or writes one of these goes through this module; nobody parses them by
hand. The formats are fixed (other processes and older run directories read and write them):

- ``policy/LATEST``: the newest published policy version as text, ``"7\\n"`` (``"v000007"`` is
  read too). Written by the trainer after the ``vNNNNNN/`` directory is complete, atomically and
  fsynced. Missing: nothing published yet.
- ``checkpoints/LATEST``: JSON ``{"generation", "step", "tag"}`` of the newest complete checkpoint.
  A bare tag (what older runs wrote) is read too; its step is the first run of digits in its name.
- ``endpoints/*.json``: one announcement per file (:class:`EndpointRecord`): ``role`` (``infer``,
  ``loading``, ``rollout``; absent in ``rollout-server.json``), ``url``, ``heartbeat`` (a counter:
  liveness is its change, never a clock), ``version`` (the policy served), ``loading`` (the version
  being read from disk; a record that names a served version always names it, null when none),
  ``host``, ``pid``; every other key is kept as its writer wrote it. Written atomically; fsynced
  only when written once (heartbeated ones are rewritten every few seconds).
- ``control/TRAINER_WAITING`` (:class:`TrainerWaiting`): JSON ``{"step", "policy_version",
  "generation", "since"}``, present only while the trainer is blocked waiting for the samples of
  its next step (written atomically, not fsynced: a hint that means nothing after a crash). Rollout
  nodes only test that it exists (:func:`trainer_waiting`, one ``stat``) and then seal their open
  shard at once instead of at its age limit.
- spool task records (:class:`TaskRecord`): ``task_id``, ``group_size``, ``policy_version`` (the
  version current when the trainer issued the task; a trajectory's ``task_version``), ``epoch``,
  ``position``, ``instance_id``; every other key (the task itself when it is inline) is kept.

Readers return None for a missing file and raise :class:`~hpc.errors.RecordError` naming the file
and the problem for content that is not the record; the scanners of ``endpoints/`` skip such files
(and half-written ones) the way they skip a file that vanished between listing and reading.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc.errors import RecordError
from hpc.fsutil import atomic_write_json, atomic_write_text
from hpc.paths import RunPaths


def _opt_int(data: Mapping[str, Any], key: str, where: str) -> int | None:
    value = data.get(key)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise RecordError(f"{where}: {key} must be an integer or null, not {value!r}")


def _opt_str(data: Mapping[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value
    raise RecordError(f"{where}: {key} must be a string or null, not {value!r}")


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


# --- policy/LATEST -------------------------------------------------------------------------------


def parse_policy_latest(text: str, where: str = "policy/LATEST") -> int:
    """The version ``policy/LATEST`` names (``"7"``; ``"v000007"`` is accepted too)."""
    token = text.strip().removeprefix("v")
    if not token.isdigit():
        raise RecordError(f"{where}: {text.strip()[:80]!r} is not a policy version (a number such as '7')")
    return int(token)


def format_policy_latest(version: int) -> str:
    assert version >= 0, version
    return f"{version}\n"


def read_policy_latest(paths: RunPaths) -> int | None:
    """The newest published policy version; None before the first publish."""
    text = _read_text(paths.policy_latest)
    return None if text is None else parse_policy_latest(text, str(paths.policy_latest))


def write_policy_latest(paths: RunPaths, version: int) -> None:
    atomic_write_text(paths.policy_latest, format_policy_latest(version))


# --- checkpoints/LATEST --------------------------------------------------------------------------


_BARE_TAG = re.compile(r"^[\w.@/-]+$")


@dataclass(frozen=True)
class CheckpointPointer:
    """``checkpoints/LATEST``: the tag of the newest complete checkpoint, its step and the fencing
    generation of the trainer that wrote it (None when unknown: a bare tag has no generation)."""

    tag: str
    step: int | None = None
    generation: int | None = None

    def to_text(self) -> str:
        return json.dumps({"tag": self.tag, "step": self.step, "generation": self.generation}, sort_keys=True) + "\n"

    @classmethod
    def from_text(cls, text: str, where: str = "checkpoints/LATEST") -> CheckpointPointer:
        text = text.strip()
        if not text.startswith("{"):
            return cls._bare(text, where)
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise RecordError(f"{where}: not valid JSON ({exc}); expected {{\"tag\", \"step\", \"generation\"}}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("tag"), str) or not data["tag"]:
            raise RecordError(f"{where}: {text[:80]!r} has no tag; expected {{\"tag\", \"step\", \"generation\"}}")
        return cls(data["tag"], _opt_int(data, "step", where), _opt_int(data, "generation", where))

    @classmethod
    def _bare(cls, tag: str, where: str) -> CheckpointPointer:
        if not _BARE_TAG.match(tag):
            raise RecordError(f"{where}: {tag[:80]!r} is not a checkpoint tag such as step_000010-g1")
        found = re.search(r"\d+", tag.split("/")[-1])  # step_000007, step-000040, step_000007-g2
        return cls(tag, int(found.group(0)) if found else None)


def read_checkpoint_latest(paths: RunPaths) -> CheckpointPointer | None:
    """What ``checkpoints/LATEST`` names; None when there is no checkpoint yet."""
    text = _read_text(paths.checkpoint_latest)
    return None if text is None else CheckpointPointer.from_text(text, str(paths.checkpoint_latest))


def write_checkpoint_latest(paths: RunPaths, pointer: CheckpointPointer) -> None:
    atomic_write_text(paths.checkpoint_latest, pointer.to_text())


# --- endpoints/*.json ----------------------------------------------------------------------------

ENDPOINT_KEYS = ("role", "url", "heartbeat", "version", "loading", "host", "pid")


@dataclass(frozen=True, kw_only=True)
class EndpointRecord:
    """One file in ``RUN/endpoints/`` (the keys are described in the module docstring)."""

    role: str | None = None
    url: str | None = None
    heartbeat: int | None = None
    version: int | None = None
    loading: int | None = None
    host: str | None = None
    pid: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # the writer's own keys (engine, index, ...)

    def __post_init__(self) -> None:
        assert not set(self.extra) & set(ENDPOINT_KEYS), sorted(set(self.extra) & set(ENDPOINT_KEYS))

    def to_json(self) -> dict[str, Any]:
        out = dict(self.extra)
        for key in ENDPOINT_KEYS:
            value = getattr(self, key)
            if value is not None or (key == "loading" and self.version is not None):  # a server names what it loads
                out[key] = value
        return out

    @classmethod
    def from_json(cls, data: object, where: str = "endpoint record") -> EndpointRecord:
        if not isinstance(data, dict):
            raise RecordError(f"{where}: an endpoint record is a JSON object, not {type(data).__name__}")
        return cls(role=_opt_str(data, "role", where), url=_opt_str(data, "url", where),
                   heartbeat=_opt_int(data, "heartbeat", where), version=_opt_int(data, "version", where),
                   loading=_opt_int(data, "loading", where), host=_opt_str(data, "host", where),
                   pid=_opt_int(data, "pid", where), extra={k: v for k, v in data.items() if k not in ENDPOINT_KEYS})


def read_endpoint(path: Path) -> EndpointRecord | None:
    """The record in ``path``; None when it vanished or is half-written (writers replace files
    atomically, so that is transient); RecordError when it is JSON but not an endpoint record."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return EndpointRecord.from_json(data, str(path))


def scan_endpoints(directory: Path, pattern: str = "*.json") -> list[tuple[Path, EndpointRecord]]:
    """Every readable record matching ``pattern`` in ``directory`` (sorted by name); unreadable,
    half-written and malformed files are left out (a missing directory has none)."""
    out = []
    for path in sorted(directory.glob(pattern)) if directory.is_dir() else []:
        try:
            record = read_endpoint(path)
        except RecordError:
            continue  # hand-edited or written by something else: not an announcement
        if record is not None:
            out.append((path, record))
    return out


def write_endpoint(path: Path, record: EndpointRecord, *, fsync: bool = False) -> None:
    """Announcements are rewritten every few seconds and mean nothing after a crash: no fsync
    unless the writer asks (a record written once, such as ``rollout-server.json``)."""
    atomic_write_json(path, record.to_json(), fsync=fsync)


# --- spool task records --------------------------------------------------------------------------

SPOOL_KEYS = ("task_id", "group_size", "policy_version", "epoch", "position")  # the spool's; instance_id is the task's
TASK_KEYS = (*SPOOL_KEYS, "instance_id")


@dataclass(frozen=True, kw_only=True)
class TaskRecord:
    """One spool task: what the trainer's feeder (or the rollout service) puts and rollout nodes claim.

    ``policy_version`` is the version current when the task was issued (None when the writer has
    none, e.g. the rollout service); trajectories carry it as ``task_version`` (-1 when None).
    ``fields`` holds every other key: the SWE-bench fields of an inline task, ``instance``,
    ``sampling_params``, ``service``, ...
    """

    task_id: str
    group_size: int | None = None
    policy_version: int | None = None
    epoch: int | None = None
    position: int | None = None
    instance_id: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert not set(self.fields) & set(TASK_KEYS), sorted(set(self.fields) & set(TASK_KEYS))

    @property
    def task_version(self) -> int:
        return -1 if self.policy_version is None else self.policy_version

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task_id": self.task_id}
        for key in TASK_KEYS[1:]:
            if (value := getattr(self, key)) is not None:
                out[key] = value
        return {**out, **self.fields}

    @classmethod
    def from_json(cls, data: object, where: str = "spool task") -> TaskRecord:
        if not isinstance(data, Mapping) or data.get("task_id") in (None, ""):
            raise RecordError(f"{where}: a task record is a JSON object with a task_id, not {str(data)[:80]!r}")
        return cls(task_id=str(data["task_id"]), group_size=_opt_int(data, "group_size", where),
                   policy_version=_opt_int(data, "policy_version", where), epoch=_opt_int(data, "epoch", where),
                   position=_opt_int(data, "position", where), instance_id=_opt_str(data, "instance_id", where),
                   fields={k: v for k, v in data.items() if k not in TASK_KEYS})


# --- control/TRAINER_WAITING ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TrainerWaiting:
    """The trainer (consumer generation ``generation``) is blocked waiting for the samples of ``step``, which
    it will train at ``policy_version``; ``since`` is its wall clock when the wait began (for operators: no
    reader compares it with its own clock)."""

    step: int
    policy_version: int
    generation: int
    since: float

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "policy_version": self.policy_version, "generation": self.generation,
                "since": self.since}

    @classmethod
    def from_json(cls, data: object, where: str = "control/TRAINER_WAITING") -> TrainerWaiting:
        keys = ("step", "policy_version", "generation")
        if not isinstance(data, Mapping) or any(_opt_int(data, k, where) is None for k in keys):
            raise RecordError(f"{where}: expected a JSON object with integer step, policy_version and "
                              f"generation, not {str(data)[:80]!r}")
        since = data.get("since")
        if not isinstance(since, (int, float)) or isinstance(since, bool):
            raise RecordError(f"{where}: since must be a number (seconds since the epoch), not {since!r}")
        return cls(step=data["step"], policy_version=data["policy_version"], generation=data["generation"],
                   since=float(since))


def trainer_waiting(paths: RunPaths) -> bool:
    """Whether the trainer waits for samples now (one ``stat``: what rollout nodes check every poll)."""
    return paths.trainer_waiting.exists()


def read_trainer_waiting(paths: RunPaths) -> TrainerWaiting | None:
    """What the trainer waits for; None when it does not wait."""
    text = _read_text(paths.trainer_waiting)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RecordError(f"{paths.trainer_waiting}: not valid JSON ({exc})") from exc
    return TrainerWaiting.from_json(data, str(paths.trainer_waiting))


def write_trainer_waiting(paths: RunPaths, record: TrainerWaiting) -> None:
    atomic_write_json(paths.trainer_waiting, record.to_json(), fsync=False)


def clear_trainer_waiting(paths: RunPaths) -> None:
    """The trainer no longer waits (a missing marker is fine)."""
    paths.trainer_waiting.unlink(missing_ok=True)
