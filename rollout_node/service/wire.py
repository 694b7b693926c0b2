"""The ProRL-Agent-Server wire format, as pure functions: request checks, ``data_source`` routing,
the spool task a ``/process`` becomes, and the result dict a finished trajectory becomes.

Guarantees:
- Every check raises :class:`WireError` with the HTTP status and a message naming the field and
  the fix; nothing here does I/O.
- ``data_source`` names map to handlers through :data:`DATA_SOURCES` (the list README documents);
  an unknown or missing name is a 400 that lists the accepted ones.
- The result carries ProRL's fields (``instance_id``, ``trajectory_id``, ``git_patch`` (null when
  none), ``resolved``, ``success``, ``finish``, ``end_properly``, ``filter``, ``error``,
  ``critical_error``, ``tools``, ``messages``, ``timing``) plus spoolrl's own (``status``, ``reward``,
  the whole token record with per-token ``policy_versions``). Token IDs and logprobs are copied from
  the trajectory, which holds them exactly as the backend received and produced them; with token-level
  generation (the server's default) every assistant message carries its turn's ``input_ids``,
  ``token_ids`` and ``logprobs`` (:mod:`rollout_node.service.turns`, prefix rule checked). An episode of
  several segments (a harness that rewrote its history) is answered once, with all of them: each
  assistant message's records come from its own segment, the top-level token record is the last
  segment's, and ``segments`` lists every segment's token record in order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hpc.records import TaskRecord
from hpc.trajectory import Status, Trajectory, sampling_refusal, training_refusal
from rollout_node.agent.toolcall import TOOL_DOCS, TOOL_SPECS
from rollout_node.service.turns import turns_of

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


def check_sampling(params: Any, token_level: bool = True) -> dict[str, Any]:
    """The honoured subset of ``sampling_params``, range-checked (ints for the two counts); sampling the
    trainer cannot reproduce (``hpc.trajectory.sampling_refusal``) is a 400. ``token_level_generation``
    defaults to the server's ``token_level``."""
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise WireError(400, "sampling_params must be a JSON object")
    out: dict[str, Any] = {}
    for key, low, high in (("temperature", 0.0, 100.0), ("top_p", 0.0, 1.0)):
        if (v := _number(params, key, low, high)) is not None:
            out[key] = v
    if why := sampling_refusal(out.get("temperature", 1.0), out.get("top_p", 1.0)):
        raise WireError(400, f"sampling_params: {why}")
    for key in ("max_iterations", "max_output_tokens"):
        if (v := _number(params, key, 1, 1_000_000)) is not None:
            if v != int(v):
                raise WireError(400, f"sampling_params.{key}: {params[key]!r} must be a whole number")
            out[key] = int(v)
    level = params.get("token_level_generation", token_level)
    if not isinstance(level, bool):
        raise WireError(400, f"sampling_params.token_level_generation: {level!r} must be true or false")
    out["token_level_generation"] = level
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


def chat_tools() -> list[dict[str, Any]]:
    """The agent's tools in ChatCompletion format (ProRL's ``tools``), from the parser's own table."""
    docs = {line[2:].split(" ", 1)[0]: line.split(": ", 1)[1] for line in TOOL_DOCS.splitlines() if line.startswith("- ")}
    kinds = {str: "string", int: "integer", float: "number"}
    return [{"type": "function", "function": {
        "name": name, "description": docs[name],
        "parameters": {"type": "object", "properties": {a: {"type": kinds[t]} for a, (t, _) in args.items()},
                       "required": [a for a, (_, needed) in args.items() if needed]}}}
        for name, args in TOOL_SPECS.items()]


def messages(segments: list[Trajectory], stored: list[dict[str, Any]], token_level: bool) -> list[dict[str, Any]]:
    """The answer's ``messages``: with ``token_level``, each assistant message gets its turn's exact
    ``input_ids`` (cut from its own segment's trajectory: ``segment`` k, default the only one) besides
    ``token_ids``/``logprobs``; without, none of the three."""
    out = [dict(m) for m in stored]
    assistant = [m for m in out if m["role"] == "assistant"]
    if not token_level:
        for m in assistant:
            m.pop("token_ids", None)
            m.pop("logprobs", None)
        return out
    for k, traj in enumerate(segments):
        mine = [m for m in assistant if int(m.get("segment", 0)) == k]
        calls = [(int(m["prompt_len"]), m["token_ids"], m["logprobs"]) for m in mine]
        for m, turn in zip(mine, turns_of(traj.token_ids.tolist(), calls), strict=True):
            m.update(turn.fields())
    if len(assistant) != sum(1 for m in assistant if "input_ids" in m):
        raise ValueError("an assistant message names a segment the episode does not have")
    return out


def _tokens(traj: Trajectory) -> dict[str, Any]:
    return {"token_ids": traj.token_ids.tolist(), "loss_mask": traj.loss_mask.tolist(),
            "logprobs": traj.logprobs.tolist(), "policy_versions": traj.policy_versions.tolist(),
            "prompt_len": traj.prompt_len}


def result(traj: Trajectory, job_id: str, trajectory_id: str, instance: Mapping[str, Any], token_level: bool,
           elapsed_s: float, node: dict[str, Any], earlier: Sequence[Trajectory] = ()) -> dict[str, Any]:
    """The ``/process`` answer for a finished episode (see the module docstring): ``traj`` its last segment,
    ``earlier`` the segments before it (a harness that rewrote its history), listed in ``segments``."""
    metrics = dict(traj.metrics)
    segments = [*earlier, traj]
    error = metrics.get("error") or (None if traj.status in (Status.OK, Status.TRUNCATED) else traj.status.value)
    return {
        "instance_id": instance["instance_id"], "trajectory_id": trajectory_id, "job_id": job_id,
        "git_patch": metrics.get("git_patch") or None, "resolved": traj.reward == 1.0,
        "success": not traj.status.infrastructure and traj.status != Status.CANCELLED,
        "finish": bool(metrics.get("submitted", False)), "end_properly": traj.status == Status.OK,
        "filter": not traj.status.trainable or bool(training_refusal(traj.logprob_kind, traj.sampling)), "error": error, "critical_error": critical_stage(traj),
        "tools": chat_tools(), "messages": messages(segments, metrics.get("service_messages", []), token_level),
        "timing": timing(traj, elapsed_s),
        "status": traj.status.value, "reward": traj.reward, "stop_reason": metrics.get("stop_reason"),
        **_tokens(traj), "logprob_kind": traj.logprob_kind, **node,
        **({"segments": [_tokens(t) for t in segments]} if earlier else {}),
    }


def failure(job_id: str, trajectory_id: str, instance: Mapping[str, Any], error: str,
            critical: str | None) -> dict[str, Any]:
    """A result with no trajectory (cancelled, or past its deadline: ``critical`` ``"timeout"``)."""
    return {"instance_id": instance.get("instance_id"), "trajectory_id": trajectory_id, "job_id": job_id,
            "git_patch": None, "resolved": False, "success": False, "finish": False, "end_properly": False,
            "filter": True, "error": error, "critical_error": critical, "tools": chat_tools(), "messages": [],
            "timing": {"init": 0.0, "run": 0.0, "eval": 0.0, "others": 0.0},
            "status": Status.TIMEOUT.value if critical == "timeout" else Status.CANCELLED.value, "reward": None}
