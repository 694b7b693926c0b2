"""The ProRL-Agent-Server wire format, as pure functions: request checks, ``data_source`` routing,
the spool task a ``/process`` becomes, and the result dict a finished trajectory becomes.

Guarantees:
- Every check raises :class:`WireError` with the HTTP status and a message naming the field and
  the fix; nothing here does I/O.
- ``data_source`` names map to handlers through :data:`DATA_SOURCES` (the list README documents);
  an unknown or missing name is a 400 that lists the accepted ones.
- The result carries ProRL's fields (``instance_id``, ``trajectory_id``, ``git_patch``, ``resolved``,
  ``success``, ``finish``, ``error``, ``critical_error``, ``messages``, ``timing``) plus spoolrl's own
  (``status``, ``reward``, the whole token record with per-token ``policy_versions``). Token IDs and
  logprobs are copied from the trajectory, which holds them exactly as the backend produced them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from hpc.records import TaskRecord
from hpc.trajectory import Status, Trajectory

# instance.data_source -> handler. Every SWE-bench-format source runs the same SWE handler: the
# INIT -> RUN -> EVAL pipeline on SWE-bench fields (repo, base_commit, patch, test_patch, tests).
DATA_SOURCES = {
    "swe_gym": "swe", "swe_bench": "swe", "swe_bench_verified": "swe", "swe_bench_lite": "swe",
    "swe_smith": "swe", "r2e_gym": "swe", "spoolrl": "swe",
}
# sampling_params keys honoured, and the limit each sets (others, e.g. model or api_key, are ignored)
SAMPLING_KEYS = ("temperature", "top_p", "max_iterations", "max_output_tokens", "token_level_generation")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


class WireError(Exception):
    """A request the API refuses: ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _number(params: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = params.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WireError(400, f"sampling_params.{key}: {value!r} is not a finite number")
    if not low <= value <= high:
        raise WireError(400, f"sampling_params.{key}: {value!r} is outside [{low}, {high}]")
    return float(value)


def check_sampling(params: Any) -> dict[str, Any]:
    """The honoured subset of ``sampling_params``, range-checked (ints for the two counts)."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise WireError(400, "sampling_params must be a JSON object")
    out: dict[str, Any] = {}
    for key, low, high in (("temperature", 1e-6, 100.0), ("top_p", 1e-6, 1.0)):
        if (v := _number(params, key, low, high)) is not None:
            out[key] = v
    for key in ("max_iterations", "max_output_tokens"):
        if (v := _number(params, key, 1, 1_000_000)) is not None:
            if v != int(v):
                raise WireError(400, f"sampling_params.{key}: {params[key]!r} must be a whole number")
            out[key] = int(v)
    out["token_level_generation"] = bool(params.get("token_level_generation", False))
    return out


def check_instance(instance: Any) -> tuple[dict[str, Any], str]:
    """(instance, handler): the instance must be an object naming an accepted ``data_source``."""
    if not isinstance(instance, Mapping):
        raise WireError(400, "instance must be a JSON object with data_source and instance_id")
    source = instance.get("data_source")
    handler = DATA_SOURCES.get(str(source)) if isinstance(source, str) else None
    if handler is None:
        raise WireError(400, f"instance.data_source {source!r} is not registered; accepted: "
                        f"{', '.join(sorted(DATA_SOURCES))}")
    if not isinstance(instance.get("instance_id"), str) or not instance["instance_id"]:
        raise WireError(400, "instance.instance_id must be a non-empty string")
    return dict(instance), handler


def check_job_id(job_id: Any, default: str) -> str:
    if job_id is None:
        return default
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise WireError(400, f"job_id {job_id!r} must be 1-128 characters of [A-Za-z0-9_.:-], starting alnum")
    return job_id


def spool_task(task_id: str, job_id: str, instance: Mapping[str, Any], sampling: Mapping[str, Any]) -> dict[str, Any]:
    """The spool record of one ``/process``: one sample; the instance inline when it carries the
    SWE-bench fields (``patch``), else a reference by ``instance_id`` into ``tasks.source``."""
    fields: dict[str, Any] = {"service": {"job_id": job_id}, "sampling_params": dict(sampling)}
    if "patch" in instance:
        fields["instance"] = {k: v for k, v in instance.items() if k not in ("data_source", "trajectory_id")}
        return TaskRecord(task_id=task_id, group_size=1, fields=fields).to_json()
    return TaskRecord(task_id=task_id, group_size=1, instance_id=instance["instance_id"], fields=fields).to_json()


def critical_stage(traj: Trajectory) -> str | None:
    """ProRL's ``critical_error``: the stage an infrastructure failure ended the episode in."""
    if not traj.status.infrastructure:
        return None
    if traj.status == Status.HARNESS_ERROR or "eval_s" in traj.timings:
        return "eval"
    return "run" if "run_s" in traj.timings else "init"


def timing(traj: Trajectory, elapsed_s: float) -> dict[str, float]:
    """Seconds inside each stage; ``others`` is the rest of the request (queueing, transfer)."""
    stages = {s: float(traj.timings.get(f"{s}_s", 0.0)) for s in ("init", "run", "eval")}
    return {**{k: round(v, 4) for k, v in stages.items()}, "others": round(max(0.0, elapsed_s - sum(stages.values())), 4)}


def result(traj: Trajectory, job_id: str, instance: Mapping[str, Any], token_level: bool, elapsed_s: float,
           node: dict[str, Any]) -> dict[str, Any]:
    """The ``/process`` answer for a finished trajectory (see the module docstring)."""
    metrics = dict(traj.metrics)
    messages = [dict(m) for m in metrics.get("service_messages", [])]
    if not token_level:
        for m in messages:
            m.pop("token_ids", None)
            m.pop("logprobs", None)
    error = metrics.get("error") or (None if traj.status in (Status.OK, Status.TRUNCATED) else traj.status.value)
    return {
        "instance_id": instance["instance_id"], "trajectory_id": str(instance.get("trajectory_id", job_id)),
        "job_id": job_id, "git_patch": str(metrics.get("git_patch", "")), "resolved": traj.reward == 1.0,
        "success": not traj.status.infrastructure and traj.status != Status.CANCELLED,
        "finish": bool(metrics.get("submitted", False)), "error": error, "critical_error": critical_stage(traj),
        "messages": messages, "timing": timing(traj, elapsed_s),
        "status": traj.status.value, "reward": traj.reward, "stop_reason": metrics.get("stop_reason"),
        "token_ids": traj.token_ids.tolist(), "loss_mask": traj.loss_mask.tolist(),
        "logprobs": traj.logprobs.tolist(), "policy_versions": traj.policy_versions.tolist(),
        "prompt_len": traj.prompt_len, "logprob_kind": traj.logprob_kind, **node,
    }


def failure(job_id: str, instance: Mapping[str, Any], error: str, critical: str | None) -> dict[str, Any]:
    """A result with no trajectory (stopped before any node reported one)."""
    return {"instance_id": instance.get("instance_id"), "trajectory_id": str(instance.get("trajectory_id", job_id)),
            "job_id": job_id, "git_patch": "", "resolved": False, "success": False, "finish": False, "error": error,
            "critical_error": critical, "messages": [], "timing": {"init": 0.0, "run": 0.0, "eval": 0.0, "others": 0.0},
            "status": Status.CANCELLED.value, "reward": None}
