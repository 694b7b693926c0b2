"""``spoolrl tasks check ... --slurm``: the task check fanned out over CPU nodes as a submitit job array.

The instances are split into ``chunks`` contiguous chunks (``chunk-00``, ``chunk-01``, ...); each is
one task of a submitit job array (``map_array``) that runs the local check
(:func:`hpc.cli.tasks.check_rows`) on its instances. From Python::

    from hpc.cli.tasks_slurm import SlurmCheckOptions, check_on_slurm
    result = check_on_slurm("builtin", SlurmCheckOptions(folder=Path("checks"), chunks=8))
    result.rows, result.retried, result.failed

Guarantees:
- The rows are those the local check prints for the same instances, in the task file's order.
- A chunk whose array task did not return rows (cancelled, preempted, killed, timed out, node
  failure, an exception) is submitted again, once, as soon as Slurm reports it ended (a plain
  job); ``retried`` maps its name to why. A chunk that fails twice gives one row per instance with
  ``ok: false`` and the reason in ``errors``, and its name in ``failed``.
- Sizing comes from flags, else from the config: partition ``slurm.rollout.partition``, time
  ``slurm.time_limit_min``, ``slurm.rollout.cpus_per_task`` / ``mem_gb`` / ``setup``; the job name is
  ``<slurm.job_name>-tasks-check``. The submitit folder (logs, pickles) and the built-in task
  repositories go under ``folder``, which every node must see (the shared filesystem).
"""

from __future__ import annotations

import sys
import tempfile
import time
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

from hpc.config import RunConfig
from hpc.errors import UsageError

if tp.TYPE_CHECKING:
    from submitit import Job

    from hpc.cli.api import ConfigSource
    from rollout_node.tasks.instance import TaskInstance

Row = dict[str, tp.Any]


@dataclass(frozen=True)
class SlurmCheckOptions:
    """How the check is spread over Slurm; ``None`` takes the config's value (see the module's guarantees)."""

    folder: Path
    chunks: int = 8
    partition: str | None = None
    time_min: int | None = None
    array_parallelism: int = 64
    poll_s: float = 1.0


@dataclass(frozen=True)
class Chunk:
    name: str
    tasks: list[TaskInstance]


@dataclass
class SlurmCheckResult:
    rows: list[Row]
    retried: dict[str, str] = field(default_factory=dict)  # chunk name -> why its first attempt failed
    failed: dict[str, str] = field(default_factory=dict)  # chunk name -> why its retry failed too
    job_ids: list[str] = field(default_factory=list)  # every array task, retries included


def split_chunks(tasks: list[TaskInstance], chunks: int) -> list[Chunk]:
    """``chunks`` contiguous, nearly equal chunks (fewer if there are fewer instances)."""
    if chunks < 1:
        raise UsageError("--chunks must be at least 1")
    n = min(chunks, len(tasks))
    bounds = [round(i * len(tasks) / n) for i in range(n + 1)]
    width = len(str(n - 1))
    return [Chunk(f"chunk-{i:0{width}d}", tasks[bounds[i]:bounds[i + 1]]) for i in range(n)]


def run_chunk(tasks: list[TaskInstance], cfg: RunConfig, cache: Path, scratch: Path | None, timeout_s: float,
              jobs: int) -> list[Row]:
    """One array task: the local check of ``tasks`` (``scratch`` None = sandbox.scratch_dir, else a
    temporary directory on the node)."""
    from hpc.cli.tasks import check_rows

    with tempfile.TemporaryDirectory(prefix="spoolrl-tasks-check-") as tmp:
        where = scratch or Path(cfg.sandbox.scratch_dir or tmp)  # as the local check chooses it
        return list(check_rows(tasks, cfg, cache, where, timeout_s, jobs))


def _executor(cfg: RunConfig, options: SlurmCheckOptions) -> tp.Any:
    import submitit

    group = cfg.slurm.rollout
    ex = submitit.SlurmExecutor(folder=options.folder / "submitit")
    ex.update_parameters(
        job_name=f"{cfg.slurm.job_name}-tasks-check", partition=options.partition or group.partition or None,
        time=options.time_min or cfg.slurm.time_limit_min, nodes=1, ntasks_per_node=1,
        cpus_per_task=group.cpus_per_task, mem=f"{max(1, round(group.mem_gb * 1024))}M",
        array_parallelism=options.array_parallelism, setup=list(group.setup),
    )
    return ex


def _outcome(job: Job[list[Row]]) -> tuple[list[Row] | None, str]:
    """(rows, "") for an array task that returned, else (None, why not)."""
    from submitit.core.utils import FailedJobError

    state = job.state
    if state.split()[0] not in ("COMPLETED", "FAILED") and not job.paths.result_pickle.exists():
        # killed from outside (cancel, preemption, time limit, node): no result will come, so do not let
        # submitit wait its 15 s for a result file a slow shared filesystem might not show yet
        return None, f"job {job.job_id} {state}: ended without a result"
    try:
        return job.result(), ""
    except FailedJobError as exc:  # the chunk raised: the traceback's last line names the exception
        trace = str(exc).split("----------------------\n")
        return None, f"job {job.job_id} raised {trace[1].strip().splitlines()[-1] if len(trace) > 2 else exc}"
    except Exception as exc:  # noqa: BLE001 - cancelled, preempted, killed, timed out: submitit's first line
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"job {job.job_id} {job.state}: {detail}"


def _submit_array(ex: tp.Any, chunks: list[Chunk], args: tuple[tp.Any, ...]) -> list[Job[list[Row]]]:
    n = len(chunks)
    return list(ex.map_array(run_chunk, [c.tasks for c in chunks], *[[a] * n for a in args]))


def check_on_slurm(source: str, options: SlurmCheckOptions, *, config: ConfigSource = None, overrides: tp.Sequence[str] = (),
                   instances: tp.Sequence[str] = (), repo_cache: Path | None = None, scratch: Path | None = None,
                   timeout_s: float | None = None, jobs: int = 2,
                   log: tp.Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> SlurmCheckResult:
    """``spoolrl tasks check SOURCE --slurm`` from Python: ``config`` is a YAML file, a dict or a RunConfig
    (validated as :meth:`hpc.cli.api.Run.create` validates it); ``scratch`` None = a temporary directory
    on each node; ``timeout_s`` None = rollout.eval_timeout_s."""
    from hpc.cli.api import load_run_config
    from hpc.cli.tasks import repo_cache as find_cache
    from hpc.cli.tasks import select_tasks

    cfg = load_run_config(config, overrides)
    tasks = select_tasks(source, list(instances))
    if jobs < 1:
        raise UsageError("--jobs must be at least 1")
    chunks = split_chunks(tasks, options.chunks)
    cache = find_cache(source, cfg, repo_cache, options.folder, {t.repo for t in tasks})
    return run_chunks(chunks, cfg, options, cache=cache, scratch=scratch,
                      timeout_s=timeout_s or cfg.rollout.eval_timeout_s, jobs=jobs, log=log)


def run_chunks(chunks: list[Chunk], cfg: RunConfig, options: SlurmCheckOptions, *, cache: Path,
               scratch: Path | None, timeout_s: float, jobs: int,
               log: tp.Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> SlurmCheckResult:
    """Submit the chunks as one array, resubmit a failed chunk at once (once), gather the rows."""
    ex = _executor(cfg, options)
    args = (cfg, cache, scratch, timeout_s, jobs)
    handles = _submit_array(ex, chunks, args)
    log(f"tasks check: {len(chunks)} chunk(s) submitted as job array {handles[0].job_id.split('_')[0]} "
        f"({options.folder / 'submitit'})")
    result = SlurmCheckResult(rows=[], job_ids=[h.job_id for h in handles])
    rows: dict[str, list[Row]] = {}
    running = list(zip(chunks, handles, strict=True))
    while running:
        time.sleep(options.poll_s)
        running[0][1].watcher.update()  # one sacct call for every job (submitit's watcher is shared)
        still = []
        for chunk, handle in running:
            if not handle.done():
                still.append((chunk, handle))
                continue
            got, why = _outcome(handle)
            if got is not None:
                rows[chunk.name] = got
            elif chunk.name not in result.retried:
                retry = ex.submit(run_chunk, chunk.tasks, *args)
                result.retried[chunk.name] = why
                result.job_ids.append(retry.job_id)
                log(f"tasks check: {chunk.name} ({len(chunk.tasks)} instances) failed ({why}); "
                    f"retrying it once as job {retry.job_id}")
                still.append((chunk, retry))
            else:
                result.failed[chunk.name] = why
                log(f"tasks check: {chunk.name} failed again ({why}); its instances are reported as not ok")
                rows[chunk.name] = [{"instance_id": t.instance_id, "ok": False,
                                     "errors": [f"{chunk.name} failed twice on Slurm: {why}"]} for t in chunk.tasks]
        running = still
    result.rows = [row for chunk in chunks for row in rows[chunk.name]]
    return result
