"""Rendering sbatch scripts from ``sbatch_templates/`` (pure: no I/O except reading the template).

The templates are package data, read through :mod:`importlib.resources`, so a wheel install renders
the same script as a checkout.

Guarantees:
- A template placeholder ``{{name}}`` without a value, or a value without a placeholder, is an
  error (a bug here, never a silently wrong script).
- Every value that reaches shell code goes through :func:`shell_quote`; values on ``#SBATCH``
  lines (parsed by sbatch, not by bash) go through :func:`sbatch_quote`. User ``setup`` lines are
  shell code by intent and are copied verbatim (config validation keeps each to one line).
- A run directory with a control character (or, with a container, ',' or ':') is refused with a
  UsageError naming RUN; the config path in the header comment is written on one line.
- A heterogeneous job is a list of typed :class:`Group`\\ s rendered by :func:`render_groups`:
  ``#SBATCH hetjob`` between groups, an explicit task count per group.
- What was rendered is what runs: the script embeds the resolved config and its digest
  (:func:`hpc.rundir.config_digest`); before starting anything the job runs ``spoolrl init
  --if-missing --expect-digest`` on it, which creates a missing RUN from it and refuses a RUN frozen
  with a different config (naming the keys; resumable keys aside).
- The same inputs give the same bytes (no timestamps), so ``launch --dry-run`` prints exactly what
  ``render`` writes, and golden tests pin the text.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import yaml

from hpc import __version__
from hpc.config import GroupConfig, RunConfig, to_dict
from hpc.errors import UsageError
from hpc.paths import RunPaths
from hpc.rundir import config_digest

TEMPLATE_PACKAGE = "sbatch_templates"   # the top-level resources package: package data (pyproject.toml)
JOB_TEMPLATE = "job.sbatch.tmpl"
# "service": the rollout-only job behind one URL (rollout-server: task 0 serves and writes
# RUN/endpoints/rollout-server.json with its URL and token file; the other tasks are its nodes).
ROLE_VERBS = {"train": "train-node", "infer": "infer-node", "rollout": "rollout-node",
              "service": "rollout-server --host 0.0.0.0 --port 0 --run"}
CRITICAL_ROLES = ("train", "infer")
_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class TemplateError(Exception):
    """A template and its values do not match (a programming error, not a user error)."""


@dataclass(frozen=True)
class Group:
    """One het group: a role, its index in the job, and its sizing."""

    role: str
    index: int
    cfg: GroupConfig
    args: tuple[str, ...] = ()  # appended to the role's verb (shell-quoted)

    @property
    def ntasks(self) -> int:
        return self.cfg.nodes * self.cfg.ntasks_per_node


@dataclass(frozen=True)
class RenderedJob:
    """One batch script: ``name`` is 'het' or the role of a separate job."""

    name: str
    text: str


# ------------------------------------------------------------------------------------ quoting
def shell_quote(value: str | Path) -> str:
    """The one quoting helper for values in shell code."""
    return shlex.quote(str(value))


def sbatch_quote(value: str) -> str:
    """Quote a value for an ``#SBATCH --opt=VALUE`` line.

    sbatch reads these lines itself: it splits at blanks, takes ``"..."`` as one word with
    backslash escapes, and cuts at an unquoted ``#``."""
    if re.search(r"[\s\"'\\#]", value):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return value


def fill(template: str, values: dict[str, str]) -> str:
    """Replace ``{{name}}``; a missing or an unused value raises TemplateError."""
    used: set[str] = set()

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise TemplateError(f"template placeholder {{{{{name}}}}} has no value")
        used.add(name)
        return values[name]

    text = _PLACEHOLDER.sub(sub, template)
    unused = set(values) - used
    if unused:
        raise TemplateError(f"values without a placeholder in the template: {', '.join(sorted(unused))}")
    return text


def load_template(name: str = JOB_TEMPLATE) -> str:
    """The text of a packaged template (the same from a checkout and from an installed wheel)."""
    return resources.files(TEMPLATE_PACKAGE).joinpath(name).read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------ groups
def job_groups(config: RunConfig, roles: tuple[str, ...] = ("train", "infer", "rollout")) -> list[Group]:
    """The het groups of a job, in order; a role with 0 nodes has no group."""
    sizing = {"train": config.slurm.train, "infer": config.slurm.infer, "rollout": config.slurm.rollout}
    chosen = [r for r in roles if sizing[r].nodes > 0]
    return [Group(role=r, index=i, cfg=sizing[r]) for i, r in enumerate(chosen)]


def _job_options(config: RunConfig, paths: RunPaths, name: str) -> list[str]:
    slurm = config.slurm
    job_name = slurm.job_name if name == "het" else f"{slurm.job_name}-{name}"
    log_name = "slurm" if name == "het" else f"slurm-{name}"
    # In Slurm file names '%' starts a pattern (%j): a literal one in the run path is doubled.
    log = sbatch_quote(str(paths.logs).replace("%", "%%") + f"/{log_name}-%j.out")
    return [
        f"--job-name={sbatch_quote(job_name)}",
        f"--time={slurm.time_limit_min}",
        f"--output={log}",
        "--open-mode=append",
        "--requeue" if slurm.requeue else "--no-requeue",
    ]


def _group_options(group: Group, warn_s: int) -> list[str]:
    g = group.cfg
    opts = [f"--partition={sbatch_quote(g.partition)}"] if g.partition else []
    opts += [f"--nodes={g.nodes}", f"--ntasks={group.ntasks}", f"--ntasks-per-node={g.ntasks_per_node}",
             f"--cpus-per-task={g.cpus_per_task}", f"--mem={int(g.mem_gb * 1024)}M"]
    if g.gpus_per_node:
        opts.append(f"--gres=gpu:{g.gpus_per_node}")
    # Group 0 holds the batch shell: it gets the warning (B:) and relays it to its own step, then
    # requeues. Other groups' steps are warned by Slurm directly, each at its own drain time.
    opts.append(f"--signal=B:USR1@{warn_s}" if group.index == 0 else f"--signal=USR1@{g.drain_s}")
    return opts + list(g.sbatch_extra)


def render_groups(groups: list[Group], job_options: list[str]) -> str:
    """The ``#SBATCH`` block: job options, then each group's options, ``hetjob`` in between."""
    warn_s = max(g.cfg.drain_s for g in groups)
    lines = [f"#SBATCH {opt}" for opt in job_options]
    for group in groups:
        if group.index > 0:
            lines.append("#SBATCH hetjob")
        lines.append(f"# -- het group {group.index}: {group.role}")
        lines += [f"#SBATCH {opt}" for opt in _group_options(group, warn_s)]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ shell pieces
def _launcher(g: GroupConfig) -> str:
    python = f"{shell_quote(g.python)} -m hpc.cli"
    if not g.container:
        return python
    nv = " --nv" if g.gpus_per_node else ""
    return f'apptainer exec{nv} --bind "$SPOOLRL_RUN" {shell_quote(g.container)} {python}'


def role_function(group: Group) -> str:
    setup = [f"  {line}" for line in group.cfg.setup]
    body = "\n".join([*setup, f'  exec {_launcher(group.cfg)} "$@"'])
    name = f"spoolrl_{group.role}"
    return f"{name}() {{\n{body}\n}}\nexport -f {name}"


def step_function(group: Group, *, het: bool) -> str:
    g = group.cfg
    args = [f"--het-group={group.index}"] if het else []
    args += [f"--nodes={g.nodes}", f"--ntasks={group.ntasks}", f"--ntasks-per-node={g.ntasks_per_node}",
             f"--cpus-per-task={g.cpus_per_task}"]
    if g.gpus_per_node:
        args.append(f"--gres=gpu:{g.gpus_per_node}")
    # One failed training rank breaks the collective: end the whole step. Rollout tasks are independent.
    args.append(f"--kill-on-bad-exit={1 if group.role in CRITICAL_ROLES else 0}")
    args += ["--open-mode=append", f'--output="$LOGS/{group.role}/$JOB-r$RESTART-%N-%t.log"']
    extra = "".join(f" {shell_quote(a)}" for a in group.args)
    command = shell_quote(f'spoolrl_{group.role} {ROLE_VERBS[group.role]} "$SPOOLRL_RUN"{extra}')
    srun = " \\\n    ".join(["exec srun " + " ".join(args[:5]), " ".join(args[5:]), f"bash -c {command}"])
    return f"step_{group.role}() {{  # het group {group.index}\n  {srun}\n}}"


def check_run_dir(run_dir: Path, groups: list[Group]) -> None:
    """Refuse a run directory that cannot be written into a batch script or bound into a container."""
    text = str(run_dir)
    if _CONTROL.search(text):
        raise UsageError(f"RUN: {text!r} contains a control character (newline, tab...); it would be written into "
                         "the batch script as shell code. Choose a plain path")
    boxed = [g.role for g in groups if g.cfg.container]
    if boxed and any(c in text for c in ",:"):
        raise UsageError(f"RUN: {text!r} contains ',' or ':', which 'apptainer exec --bind' (slurm.{boxed[0]}.container) "
                         "reads as separators; choose a path without them")


def one_line(text: str) -> str:
    """``text`` safe for a comment line of the script: control characters become '?'."""
    return _CONTROL.sub("?", text)


def _header(groups: list[Group], paths: RunPaths, source: str, kind: str, digest: str) -> str:
    lines = [
        f"# spoolrl {__version__}: {kind} for the run directory {paths.root}",
        f"# Generated by 'spoolrl render' from {one_line(source)}; re-render after changing the config.",
        f"# Config: {digest} (embedded below; the job refuses a RUN frozen with another config)",
        "# How to run:  sbatch THIS_FILE   (creates RUN from the embedded config if it does not exist yet;",
        "#              RUN/logs/ must exist first, as Slurm opens --output before the job starts: render creates it)",
        "# Watch it:    spoolrl status RUN      Logs: RUN/logs/<group>/ and RUN/logs/slurm-*.out",
    ]
    for g in groups:
        gpus = f", {g.cfg.gpus_per_node} GPU(s)/node" if g.cfg.gpus_per_node else ""
        lines.append(f"#   het group {g.index}: {g.role:<8} {g.cfg.nodes} node(s) x {g.cfg.ntasks_per_node} "
                     f"task(s){gpus}, partition {g.cfg.partition or '(default)'}, drain {g.cfg.drain_s}s")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ jobs
def render_script(config: RunConfig, run_dir: str | Path, groups: list[Group], *, name: str,
                  source: str = "run.yaml") -> RenderedJob:
    """One batch script running ``groups`` (a het job when there is more than one)."""
    assert groups, "a job needs at least one group"
    paths = RunPaths(Path(run_dir))
    check_run_dir(paths.root, groups)
    het = len(groups) > 1
    kind = "heterogeneous Slurm job" if het else f"Slurm job ({name} only)"
    roles = [g.role for g in groups]
    digest = config_digest(config)
    values = {
        "header": _header(groups, paths, source, kind, digest),
        "config_digest": digest,
        "config_yaml": yaml.safe_dump(to_dict(config), sort_keys=False).rstrip("\n"),
        "sbatch_groups": render_groups(groups, _job_options(config, paths, name)),
        "run_dir": shell_quote(paths.root),
        "roles": " ".join(roles),
        "critical": " ".join(r for r in roles if r in CRITICAL_ROLES),
        "max_rollout_restarts": str(config.slurm.max_rollout_restarts),
        "rollout_restart_delay_s": str(config.slurm.rollout_restart_delay_s),
        "requeue": "1" if config.slurm.requeue else "0",
        "stop_grace_s": str(config.slurm.stop_grace_s),
        "role_functions": "\n\n".join(role_function(g) for g in groups),
        "step_functions": "\n\n".join(step_function(g, het=het) for g in groups),
        "init_role": groups[0].role,
    }
    return RenderedJob(name=name, text=fill(load_template(), values))


def render(config: RunConfig, run_dir: str | Path, *, source: str = "run.yaml") -> list[RenderedJob]:
    """The run's job(s): one het job, or one job per role with ``slurm.mode: separate``."""
    groups = job_groups(config)
    if config.slurm.mode == "het":
        return [render_script(config, run_dir, groups, name="het", source=source)]
    return [render_script(config, run_dir, [Group(g.role, 0, g.cfg)], name=g.role, source=source) for g in groups]


def render_scale(config: RunConfig, run_dir: str | Path, num_nodes: int, *, source: str = "run.yaml") -> RenderedJob:
    """A rollout-only job of ``num_nodes`` nodes that joins a running run."""
    group = Group("rollout", 0, replace(config.slurm.rollout, nodes=num_nodes))
    return render_script(config, run_dir, [group], name="rollout", source=source)


def render_service(config: RunConfig, run_dir: str | Path, *, source: str = "run.yaml") -> RenderedJob:
    """The rollout-only service job: ``slurm.rollout`` nodes running ``spoolrl rollout-server`` (with
    ``--trust-network`` when ``service.trust_network`` names networks)."""
    trust = config.service.trust_network.replace(" ", "")
    group = Group("service", 0, config.slurm.rollout, ("--trust-network", trust) if trust else ())
    return render_script(config, run_dir, [group], name="service", source=source)


def joined_text(jobs: list[RenderedJob]) -> str:
    """What ``render`` prints to stdout (and ``launch --dry-run``): scripts separated by a marker line."""
    if len(jobs) == 1:
        return jobs[0].text
    return "".join(f"# ===== spoolrl job: {job.name} =====\n{job.text}" for job in jobs)
