"""``spoolrl status RUN``: one JSON document about a run, assembled from parts that may be missing.

Guarantees:
- Never raises for a missing or half-written piece (no job yet, no spool, no checkpoint, sacct
  down): that part is ``null`` or empty and ``errors[part]`` says why.
- Jobs are those submitted through spoolrl (``RUN/slurm/jobs.json``) and any other job whose
  batch script ran on this run directory (``RUN/metrics/batch-<id>.jsonl``, kind ``sbatch``), so a
  run started with ``spoolrl render`` + ``sbatch`` is reported too.
- Schema (``schema: 1``; fields are only ever added)::

    {"schema": 1, "run": str, "time": float,
     "jobs": [{"job_id": str, "name": str, "kind": "launch"|"resume"|"scale"|"sbatch", "state": str,
               "groups": [{"index": int, "role": str, "state": str}]}],
     "spool": {...Spool.stats()...} | null,
     "trainer": {"policy_version": int|null, "checkpoint": str|null, "step": int|null},
     "endpoints": [{"file": str, "role": str|null, "url": str|null, "version": int|null,
                    "heartbeat": int|null, "age_s": float}],
     "failures": [metrics records: failed steps/jobs and kinds naming a failure or error; last 20],
     "pipeline": {"<rollout process>": {"queue_depth": {stage: n}, "busy": {stage: n},
                  "episodes": int, "episodes_per_min": float, "failures": {kind: n},
                  "stage_s": {stage: {"p50", "p95", "n"}}, "draining": str, "age_s": float}},
     "training": {"step", "loss", "reward_mean", "pass_rate", "staleness_hist", "idle_fraction",
                  "tokens_per_s", "drops": {reason: n}} | null,
     "accounting": {...hpc.report.accounting: tokens generated/trained/discarded, sandbox_hours,
                    cpu_hours, gpu_hours, waste_percent, cost per trained token...} | null,
     "summary": {...hpc.report_summary.run_summary: finished, step, total_steps, start, end, duration_s,
                 reward_first/last (+ _steps, reward_of), trained_batch_reward_first/last, nonfinite_steps},
     "logs": {"<dir under RUN/logs, '.' for files directly in it>": [newest log files, at most 3]},
     "errors": {part: message}}

  ``pipeline[].state`` is ``stopped`` once the node withdrew its presence record
  (:mod:`hpc.rollout_presence`, removed after its drain), else ``draining`` or ``running``.

  ``endpoints[].age_s`` is the age of the file's mtime on this host's clock: a hint for humans,
  not a liveness test (liveness across nodes is the heartbeat counter changing).
"""

from __future__ import annotations

import time
import typing as tp
from pathlib import Path

from hpc.errors import RecordError, UsageError
from hpc.launch import known_jobs, query_states
from hpc.paths import RunPaths
from hpc.records import CheckpointPointer, read_policy_latest, scan_endpoints
from hpc.report_summary import run_summary, summary_lines
from hpc.spool import Spool

SCHEMA = 1
MAX_FAILURES = 20
MAX_LOGS = 3  # newest log files shown per directory
MIN_INTERVAL_S = 0.5  # each refresh re-reads the run directory (on Lustre: metadata load)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def jobs_part(paths: RunPaths) -> list[dict[str, tp.Any]]:
    records = known_jobs(paths)
    states = query_states([r.job_id for r in records])
    out = []
    for r in records:
        group_states = states.get(r.job_id, [])
        groups = [{"index": k, "role": role, "state": group_states[k] if k < len(group_states) else "UNKNOWN"}
                  for k, role in enumerate(r.roles)]
        out.append({"job_id": r.job_id, "name": r.name, "kind": r.kind,
                    "state": group_states[0] if group_states else "UNKNOWN", "groups": groups})
    return out


def spool_part(paths: RunPaths) -> dict[str, tp.Any] | None:
    if not paths.spool.is_dir():
        return None
    return dict(Spool(paths.root).stats())


def _policy_version(paths: RunPaths) -> int | None:
    try:
        return read_policy_latest(paths)
    except (OSError, RecordError):
        return None


def trainer_part(paths: RunPaths) -> dict[str, tp.Any]:
    """LATEST is JSON ``{tag, step, generation}`` (a bare tag in older runs): the tag and its step."""
    checkpoint, step = _read_text(paths.checkpoint_latest), None
    if checkpoint:
        try:
            pointer = CheckpointPointer.from_text(checkpoint, str(paths.checkpoint_latest))
            checkpoint, step = pointer.tag, pointer.step
        except RecordError:
            pass  # shown as it is, without a step
    return {"policy_version": _policy_version(paths), "checkpoint": checkpoint, "step": step}


def endpoints_part(paths: RunPaths, now: float) -> list[dict[str, tp.Any]]:
    out = []
    for path, rec in scan_endpoints(paths.endpoints):
        try:
            age = now - path.stat().st_mtime
        except OSError:
            continue  # being replaced right now
        out.append({"file": path.name, "role": rec.role, "url": rec.url, "version": rec.version,
                    "heartbeat": rec.heartbeat, "age_s": round(age, 1)})
    return out


def _is_failure(record: dict[str, tp.Any]) -> bool:
    kind = str(record.get("kind", ""))
    if kind in ("step_end", "job_end"):
        return str(record.get("status", "0")) != "0"
    return "fail" in kind or "error" in kind


def failures_part(records: list[dict[str, tp.Any]]) -> list[dict[str, tp.Any]]:
    """The last failure records (``records`` sorted by time)."""
    return [r for r in records if _is_failure(r)][-MAX_FAILURES:]


PIPELINE_KEYS = ("queue_depth", "busy", "episodes", "episodes_per_min", "failures", "stage_s", "draining")
TRAINING_KEYS = ("step", "loss", "reward_mean", "pass_rate", "staleness_hist", "idle_fraction", "tokens_per_s",
                 "drops", "policy_version", "nonfinite_steps")


def _node_state(record: dict[str, tp.Any], present: set[str]) -> str:
    if str(record.get("worker_id")) not in present:
        return "stopped"
    return "draining" if record.get("draining") else "running"


def pipeline_part(paths: RunPaths, records: list[dict[str, tp.Any]], now: float) -> dict[str, tp.Any]:
    from hpc.rollout_presence import present

    last: dict[str, dict[str, tp.Any]] = {}
    for r in records:
        if r.get("kind") == "node":
            last[str(r.get("process"))] = r
    alive = {p.worker_id for p in present(paths)}
    return {proc: {**{k: r.get(k) for k in PIPELINE_KEYS}, "state": _node_state(r, alive),
                   "age_s": round(now - float(r["t"]), 1)}
            for proc, r in sorted(last.items())}


def training_part(records: list[dict[str, tp.Any]]) -> dict[str, tp.Any] | None:
    steps = [r for r in records if r.get("kind") == "train_step"]
    return {k: steps[-1].get(k) for k in TRAINING_KEYS} if steps else None


def logs_part(paths: RunPaths) -> dict[str, list[str]]:
    """The newest log files under RUN/logs, per directory (``.`` for RUN/logs itself)."""
    out: dict[str, list[str]] = {}
    if not paths.logs.is_dir():
        return out
    for directory in [paths.logs, *sorted(d for d in paths.logs.iterdir() if d.is_dir())]:
        files = [f for f in directory.iterdir() if f.is_file() and f.suffix in (".log", ".out", ".err")]
        files.sort(key=lambda f: f.stat().st_mtime, reverse=True)
        if files:
            out["." if directory == paths.logs else directory.name] = [str(f) for f in files[:MAX_LOGS]]
    return out


def accounting_part(paths: RunPaths, records: list[dict[str, tp.Any]]) -> dict[str, tp.Any]:
    from hpc.report import accounting, group_hours

    hours, source = group_hours(paths, records)
    return {**accounting(records, hours), "hours_source": source}


def run_status(run_dir: str | Path) -> dict[str, tp.Any]:
    paths = RunPaths(Path(run_dir))
    now = time.time()
    status: dict[str, tp.Any] = {"schema": SCHEMA, "run": str(paths.root), "time": now, "jobs": [], "spool": None,
                                 "trainer": {"policy_version": None, "checkpoint": None, "step": None},
                                 "endpoints": [], "failures": [], "pipeline": {}, "training": None,
                                 "accounting": None, "summary": None, "logs": {}, "errors": {}}
    from hpc.metrics import read_metrics

    records = sorted(read_metrics(paths.root), key=lambda r: float(r.get("t", 0)))
    parts: dict[str, tp.Callable[[], tp.Any]] = {
        "jobs": lambda: jobs_part(paths), "spool": lambda: spool_part(paths), "trainer": lambda: trainer_part(paths),
        "endpoints": lambda: endpoints_part(paths, now), "failures": lambda: failures_part(records),
        "pipeline": lambda: pipeline_part(paths, records, now), "training": lambda: training_part(records),
        "accounting": lambda: accounting_part(paths, records), "summary": lambda: run_summary(paths.root, records),
        "logs": lambda: logs_part(paths),
    }
    for name, build in parts.items():
        try:
            status[name] = build()
        except Exception as exc:  # noqa: BLE001 - each part is best effort by contract
            status["errors"][name] = f"{type(exc).__name__}: {exc}"
    return status


def _or_dash(value: tp.Any) -> str:
    return "-" if value is None else str(value)


def _pairs(mapping: tp.Any) -> str:
    """``{'init': 0, 'run': 2}`` as ``init 0, run 2`` (``none`` when empty)."""
    if not isinstance(mapping, dict) or not mapping:
        return "none"
    return ", ".join(f"{k} {_pairs(v) if isinstance(v, dict) else v}" for k, v in mapping.items())


def _staleness(hist: tp.Any) -> str:
    """``{'0': 30, '1': 2}`` as ``30 samples 0 versions old, 2 samples 1 version old``."""
    if not isinstance(hist, dict) or not hist:
        return "-"
    return ", ".join(f"{n} samples {k} version{'' if str(k) == '1' else 's'} old" for k, n in hist.items())


def _jobs_lines(status: dict[str, tp.Any]) -> list[str]:
    lines = []
    for job in status["jobs"]:
        groups = ", ".join(f"{g['role']} {g['state']}" for g in job["groups"])
        lines.append(f"  job {job['job_id']} ({job['kind']}, {job['name']}): {job['state']}  [{groups}]")
    if not status["jobs"]:
        lines.append("  jobs: no Slurm job recorded for this run (spoolrl launch / resume / scale, or sbatch of a "
                     "rendered script); a local run (spoolrl demo) runs its roles as local processes")
    return lines


def format_status(status: dict[str, tp.Any]) -> str:
    """The human-readable form of :func:`run_status` (plain text, no Python reprs)."""
    lines = [f"run {status['run']}"]
    if status.get("summary"):
        lines.extend(f"  {line}" for line in summary_lines(status["summary"]))
    lines.extend(_jobs_lines(status))
    t = status["trainer"]
    lines.append(f"  trainer: policy version {_or_dash(t['policy_version'])}, step {_or_dash(t['step'])}, "
                 f"checkpoint {_or_dash(t['checkpoint'])}")
    if status["spool"] is not None:
        spool = status["spool"]
        keys = [k for k in sorted(spool) if k.startswith(("tasks_", "trajectories_", "shards_"))] or sorted(spool)
        lines.append("  spool: " + ", ".join(f"{k} {spool[k]}" for k in keys))
    lines.extend(_progress_lines(status))
    for e in status["endpoints"]:
        known = [str(e["role"] or "?"), *([e["url"]] if e["url"] else []),
                 *([f"v{e['version']}"] if e["version"] is not None else []),
                 *([f"heartbeat {e['heartbeat']}"] if e["heartbeat"] is not None else [])]
        lines.append(f"  endpoint {e['file']}: {' '.join(known)} (written {e['age_s']}s ago)")
    for f in status["failures"][-5:]:
        detail = {k: v for k, v in f.items() if k not in ("t", "kind", "process")}
        lines.append(f"  failure: {f.get('process')} {f.get('kind')}: {_pairs(detail)}")
    for where, files in (status.get("logs") or {}).items():
        lines.append(f"  logs ({'RUN/logs' if where == '.' else where}): {', '.join(files)}")
    for part, msg in status["errors"].items():
        lines.append(f"  ({part} unavailable: {msg})")
    return "\n".join(lines)


def _fmt(value: tp.Any, spec: str = ".3f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def _progress_lines(status: dict[str, tp.Any]) -> list[str]:
    lines = []
    tr = status.get("training")
    if tr:
        nonfinite = f"  non-finite steps {tr['nonfinite_steps']}" if tr.get("nonfinite_steps") is not None else ""
        lines.append(f"  last step {tr.get('step')}: loss {_fmt(tr.get('loss'), '.4f')}  trained batch reward "
                     f"(after filters) {_fmt(tr.get('reward_mean'))}  pass {_fmt(tr.get('pass_rate'))}  idle "
                     f"{_fmt(tr.get('idle_fraction'), '.1%')}  {_fmt(tr.get('tokens_per_s'), '.0f')} tok/s  "
                     f"staleness {_staleness(tr.get('staleness_hist'))}  dropped "
                     f"{_pairs(tr.get('drops'))}{nonfinite}")
    for proc, node in (status.get("pipeline") or {}).items():
        state = node.get("state") or ("draining" if node.get("draining") else "running")
        why = f" ({node['draining']})" if state != "running" and node.get("draining") else ""
        lines.append(f"  rollout {proc}: {state}{why}, last record {node.get('age_s')}s ago; queued "
                     f"{_pairs(node.get('queue_depth'))}; busy {_pairs(node.get('busy'))}; episodes "
                     f"{node.get('episodes')} ({_fmt(node.get('episodes_per_min'), '.1f')}/min); failures "
                     f"{_pairs(node.get('failures'))}")
    acct = status.get("accounting")
    if acct:
        lines.append(f"  tokens: generated {acct['tokens_generated']}, trained {acct['tokens_trained']}, "
                     f"discarded {acct['tokens_discarded']} ({acct['waste_percent']:.1f}% waste); sandbox-hours "
                     f"{acct['sandbox_hours']:.3f}; CPU-h {acct['cpu_hours']:.3f}, GPU-h {acct['gpu_hours']:.3f}")
    return lines


def check_interval(interval_s: float) -> None:
    """Refuse a live-view interval below :data:`MIN_INTERVAL_S` (0 would re-read the run directory in a loop)."""
    if not interval_s >= MIN_INTERVAL_S:  # also catches NaN
        raise UsageError(f"--interval-s {interval_s:g}: the live view re-reads the whole run directory each time; "
                         f"give at least {MIN_INTERVAL_S:g} seconds (default 2)")


def watch(run_dir: str | Path, out: tp.TextIO, *, interval_s: float = 2.0, max_updates: int | None = None) -> None:
    """The live view: redraw :func:`format_status` in place until Ctrl-C (or ``max_updates``)."""
    check_interval(interval_s)
    n = 0
    while max_updates is None or n < max_updates:
        text = format_status(run_status(run_dir))
        out.write("\x1b[H\x1b[2J" + text + f"\n\n(refreshing every {interval_s:g} s; Ctrl-C to quit)\n")
        out.flush()
        n += 1
        if max_updates is None or n < max_updates:
            time.sleep(interval_s)
