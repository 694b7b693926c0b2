"""``spoolrl report RUN``: PNG plots, one self-contained HTML page and ``report.json`` for a run.

Guarantees:
- Every plotted series is in ``report.json`` (x and y lists), computed only from the run's metrics
  files (and sacct for Slurm jobs), so a test can recompute it independently.
- A series without data is not drawn as an empty plot: it is listed under ``skipped`` with why.
- The reward plotted and summarised is the mean over every finished episode of the step's tasks, the trained
  batch's (after filters) beside it (:mod:`hpc.report_summary`, as the demo and ``status`` print it);
  ``report.json`` has the run's summary (finished, steps, start, end, wall time, first-3 -> last-5 reward,
  non-finite steps) and its ``run.yaml`` text, which the page shows too.
- Without matplotlib the page and ``report.json`` are still written, without plots (each listed under
  ``skipped``), and :func:`write_report` says so in one line (``missing``).
- An HTML path (``-o``) whose directory does not exist is a UsageError before anything is written.
- Accounting: tokens generated, trained and discarded (by reason), sandbox-hours, CPU- and
  GPU-hours per group (sacct on Slurm; process wall time x CPUs for local runs), waste as a
  percentage, and the cost per trained token in those units.
- The HTML page (:mod:`hpc.report_html`) is one self-contained file - the PNGs as data URIs, no network -
  with a summary table, the plots and the best and worst rollouts of recent steps decoded as
  conversations with the run's tokenizer (:mod:`hpc.report_samples`, :mod:`hpc.decode`), so it can be
  copied off a cluster and shared. ``report.json`` adds the model, tokens by fate and which samples
  the page shows.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hpc.errors import UsageError
from hpc.fsutil import atomic_write_text
from hpc.metrics import read_metrics
from hpc.overlap import overlap_figures
from hpc.paths import RunPaths
from hpc.report_summary import run_summary, step_rewards

Series = dict[str, dict[str, list[float]]]  # label -> {"x": [...], "y": [...]}


def _line(records: Iterable[dict[str, Any]], x: str, ys: dict[str, str]) -> Series:
    out: Series = {label: {"x": [], "y": []} for label in ys}
    for rec in records:
        for label, key in ys.items():
            if isinstance(rec.get(key), (int, float)) and isinstance(rec.get(x), (int, float)):
                out[label]["x"].append(float(rec[x]))
                out[label]["y"].append(float(rec[key]))
    return {k: v for k, v in out.items() if v["x"]}


def _by_time(records: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    return [{**r, "minute": (r["t"] - t0) / 60.0} for r in records]


def _staleness(steps: list[dict[str, Any]]) -> Series:
    out: Series = {"mean staleness": {"x": [], "y": []}, "max staleness": {"x": [], "y": []}}
    for rec in steps:
        hist = {int(k): int(v) for k, v in (rec.get("staleness_hist") or {}).items()}
        if not hist:
            continue
        n = sum(hist.values())
        for label, value in (("mean staleness", sum(k * v for k, v in hist.items()) / n),
                             ("max staleness", max(hist))):
            out[label]["x"].append(float(rec["step"]))
            out[label]["y"].append(float(value))
    return {k: v for k, v in out.items() if v["x"]}


def _stage_series(nodes: list[dict[str, Any]], field: str, quantile: str | None) -> Series:
    out: Series = defaultdict(lambda: {"x": [], "y": []})
    for rec in nodes:
        for stage, value in (rec.get(field) or {}).items():
            v = value.get(quantile) if quantile and isinstance(value, dict) else value
            if isinstance(v, (int, float)):
                out[f"{stage}{' ' + quantile if quantile else ''}"]["x"].append(rec["minute"])
                out[f"{stage}{' ' + quantile if quantile else ''}"]["y"].append(float(v))
    return dict(out)


def _failures(episodes: list[dict[str, Any]]) -> dict[str, int]:
    return dict(Counter(str(e.get("status")) for e in episodes if e.get("status") not in ("ok", None)))


REWARD = "reward (every finished episode of the step's tasks)"
BATCH_REWARD = "trained batch reward (after filters)"


def collect_series(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Every plotted series, from metrics records alone (pure)."""
    t0 = min((r["t"] for r in records), default=0.0)
    steps = sorted((r for r in records if r.get("kind") == "train_step"), key=lambda r: r["step"])
    nodes = _by_time([r for r in records if r.get("kind") == "node"], t0)
    episodes = [r for r in records if r.get("kind") == "episode"]
    return {
        "reward": {**_line(step_rewards(records), "step", {REWARD: "reward"}),
                   **_line(steps, "step", {BATCH_REWARD: "reward_mean", "pass rate (trained batch)": "pass_rate"})},
        "loss": _line(steps, "step", {"loss": "loss"}),
        "lr": _line(steps, "step", {"learning rate": "lr"}),
        "step_kl": _line(steps, "step", {"step KL (measured after the update)": "step_kl",
                                         "KL term of the loss (per token)": "kl"}),
        "grad_norm": _line(steps, "step", {"gradient norm (before clipping)": "grad_norm"}),
        "episodes_per_min": _line(nodes, "minute", {"episodes/min": "episodes_per_min"}),
        "stage_time_s": {**_stage_series(nodes, "stage_s", "p50"), **_stage_series(nodes, "stage_s", "p95")},
        "queue_depth": _stage_series(nodes, "queue_depth", None),
        "staleness": _staleness(steps),
        "idle_fraction": _line(steps, "step", {"trainer idle fraction": "idle_fraction"}),
        "failures_by_kind": _failures(episodes),
    }


def accounting(records: list[dict[str, Any]], group_hours: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Tokens generated/trained/discarded, sandbox-hours, CPU/GPU-hours, waste and cost per trained token."""
    episodes = [r for r in records if r.get("kind") == "episode"]
    steps = [r for r in records if r.get("kind") == "train_step"]
    generated = sum(int(e.get("generated_tokens") or 0) for e in episodes)
    trained = sum(int(s.get("loss_tokens") or 0) for s in steps)
    drops: Counter[str] = Counter()
    for s in steps[-1:]:  # the trainer logs cumulative drop counts
        drops.update({str(k): int(v) for k, v in (s.get("drops") or {}).items()})
    sandbox_s = sum(sum(v for v in (e.get("timings") or {}).values() if isinstance(v, (int, float)))
                    for e in episodes)
    cpu_h = sum(g.get("cpu_hours", 0.0) for g in group_hours.values())
    gpu_h = sum(g.get("gpu_hours", 0.0) for g in group_hours.values())
    discarded = max(generated - trained, 0)
    return {
        "tokens_generated": generated, "tokens_trained": trained, "tokens_discarded": discarded,
        "samples_discarded_by_reason": dict(drops),
        "episodes": len(episodes), "episodes_by_status": dict(Counter(str(e.get("status")) for e in episodes)),
        "sandbox_hours": sandbox_s / 3600.0, "groups": group_hours,
        "cpu_hours": cpu_h, "gpu_hours": gpu_h,
        "waste_percent": 100.0 * discarded / generated if generated else 0.0,
        "cpu_hours_per_million_trained_tokens": cpu_h / trained * 1e6 if trained else None,
        "gpu_hours_per_million_trained_tokens": gpu_h / trained * 1e6 if trained else None,
    }


def local_group_hours(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Without Slurm: each process's wall time (first to last record) per role, at one CPU per process."""
    spans: dict[str, list[float]] = defaultdict(list)
    for r in records:
        spans[str(r.get("process"))].append(float(r["t"]))
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"cpu_hours": 0.0, "gpu_hours": 0.0})
    for process, ts in spans.items():
        role = process.split("-")[0] if "-" in process else process
        out[role]["cpu_hours"] += (max(ts) - min(ts)) / 3600.0
    return dict(out)


def group_hours(paths: RunPaths, records: list[dict[str, Any]]) -> tuple[dict[str, dict[str, float]], str]:
    from hpc.launch import read_records

    jobs = read_records(paths)
    if not jobs:
        return local_group_hours(records), "local processes (wall time x 1 CPU)"
    from hpc.accounting import slurm_group_hours

    return slurm_group_hours(jobs), "sacct (ElapsedRaw x allocated CPUs / GPUs)"


PLOTS = {  # name -> (title, x label, y label)
    "reward": ("Reward and pass rate", "trainer step", "value"),
    "loss": ("Policy loss", "trainer step", "loss"),
    "lr": ("Learning rate", "trainer step", "lr"),
    "step_kl": ("KL to the previous / reference policy", "trainer step", "KL"),
    "grad_norm": ("Gradient norm", "trainer step", "norm"),
    "episodes_per_min": ("Episodes per minute", "minutes since start", "episodes/min"),
    "stage_time_s": ("Time per pipeline stage", "minutes since start", "seconds"),
    "queue_depth": ("Queue depth between stages", "minutes since start", "items"),
    "staleness": ("Staleness of trained samples", "trainer step", "policy versions"),
    "idle_fraction": ("Trainer idle fraction (waiting for data)", "trainer step", "fraction"),
    "failures_by_kind": ("Episodes that did not end ok, by status", "status", "episodes"),
}


STYLES, MARKERS = ("-", "--", ":", "-."), ("o", "s", "^", "D")
NO_MATPLOTLIB = ("matplotlib is not installed: wrote the HTML page and report.json without plots "
                 "(for plots: pip install 'spoolrl[report]')")


def _plot(name: str, data: Any, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    title, xlabel, ylabel = PLOTS[name]
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    if name == "failures_by_kind":
        ax.bar(list(data), list(data.values()), color="tab:red")
    elif name == "queue_depth":  # integer counts that change in steps: step lines, one style per stage
        for (label, xy), style in zip(sorted(data.items()), STYLES, strict=False):
            ax.step(xy["x"], xy["y"], where="post", linestyle=style, linewidth=1.6, label=label)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        top = max((max(xy["y"]) for xy in data.values()), default=1.0)
        ax.set_ylim(0, top * 1.35 + 1)  # headroom: the legend sits above the data, not on it
        ax.legend(fontsize=8, ncol=max(len(data), 1), loc="upper center", title="stage", title_fontsize=8)
    else:  # lines that coincide stay distinguishable: one line style and marker each
        for (label, xy), style, marker in zip(data.items(), STYLES * 3, MARKERS * 3, strict=False):
            ax.plot(xy["x"], xy["y"], linestyle=style, marker=marker, markersize=3, label=label)
        ax.legend(fontsize=8)
    if name == "lr":
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def _html(paths: RunPaths, records: list[dict[str, Any]], pngs: dict[str, Path], report: dict[str, Any]) -> str:
    from hpc.decode import conversation, load_tokenizer, run_tokenizer_dir
    from hpc.errors import UsageError
    from hpc.report_html import page, rollout_html, summary_rows
    from hpc.report_samples import read_ledgers, recent_samples

    picks, where = recent_samples(paths, read_ledgers(paths))
    rollouts: list[str] = []
    if picks:
        try:
            tokenizer = load_tokenizer(run_tokenizer_dir(paths.root))
        except UsageError as exc:
            where += f" (not decoded: {exc})"
            picks = []
        for kind, traj in picks:
            rollouts.append(rollout_html(kind, traj, conversation(tokenizer, traj.token_ids, traj.loss_mask)))
    report["samples"] = {"from": where, **{kind: t.trajectory_id for kind, t in picks}}
    rows = summary_rows(paths.root, report["model"], records, report)
    return page(paths.root, rows, pngs, {n: PLOTS[n][0] for n in PLOTS}, rollouts, where, report["skipped"],
                config=report["config"])


def build_report(paths: RunPaths) -> dict[str, Any]:
    records = list(read_metrics(paths.root))
    hours, source = group_hours(paths, records)
    series = collect_series(records)
    skipped = {name: "no data in the metrics files" for name, data in series.items() if not data}
    from hpc.report_samples import read_ledgers, run_model, tokens_by_fate

    try:
        config = paths.run_yaml.read_text()
    except OSError as exc:
        config = f"(run.yaml unreadable: {exc})"
    return {"schema": 1, "run": str(paths.root), "model": run_model(paths), "series": series, "skipped": skipped,
            "summary": run_summary(paths.root, records), "config": config,
            "accounting": {**accounting(records, hours), "hours_source": source}, "overlap": overlap_figures(records),
            "tokens_by_fate": tokens_by_fate(records, read_ledgers(paths))}


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_report(run_dir: Path, html_path: Path | None = None, *, missing: list[str] | None = None) -> Path:
    """Write RUN/report/{*.png, report.json} and the HTML page; returns the HTML path. Without matplotlib,
    no PNGs and :data:`NO_MATPLOTLIB` is appended to ``missing`` (the CLI prints it)."""
    paths = RunPaths(run_dir)
    if not paths.metrics.is_dir():
        from hpc.errors import RunDirError

        raise RunDirError(f"{paths.root} has no metrics/ directory; is it a spoolrl run directory?")
    if html_path is not None and not html_path.absolute().parent.is_dir():
        raise UsageError(f"-o {html_path}: the directory {html_path.absolute().parent} does not exist; "
                         "create it first or choose another path")
    out_dir = paths.root / "report"
    out_dir.mkdir(exist_ok=True)
    report = build_report(paths)
    pngs = {}
    plots = _have_matplotlib()
    for name, data in report["series"].items():
        if data and plots:
            pngs[name] = out_dir / f"{name}.png"
            _plot(name, data, pngs[name])
        elif data:
            report["skipped"][name] = "matplotlib is not installed (pip install 'spoolrl[report]')"
    if not plots and missing is not None:
        missing.append(NO_MATPLOTLIB)
    report["plots"] = {name: str(p) for name, p in pngs.items()}
    target = html_path or out_dir / "report.html"
    atomic_write_text(target, _html(paths, list(read_metrics(paths.root)), pngs, report))
    atomic_write_text(out_dir / "report.json", json.dumps(report, indent=1, sort_keys=True) + "\n")
    return target
