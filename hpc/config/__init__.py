"""The run config: ``run.yaml`` maps one to one onto :class:`RunConfig`.

``load_config`` reads YAML, applies dotted ``key=value`` overrides, and validates everything
before anything is created on disk; problems are raised together as one :class:`ConfigError`.
Validation here is pure: each section's own rules, then the rules across sections
(:mod:`hpc.config.checks`). What needs the filesystem (do the named paths exist from here?) is
:mod:`hpc.config.site`, which the CLI runs after loading.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hpc.config.base import build, control_problem, iter_fields, knob, section, to_dict
from hpc.config.checks import cross_section_problems
from hpc.config.inference import InferenceConfig
from hpc.config.rollout import RolloutConfig
from hpc.config.sandbox import SandboxConfig
from hpc.config.service import ServiceSection
from hpc.config.slurm import GroupConfig, SlurmConfig
from hpc.config.spool import SpoolConfig
from hpc.config.tasks import ModelConfig, RunSection, TasksConfig
from hpc.config.trainer import AlgorithmConfig, TrainerConfig
from hpc.errors import ConfigError
from hpc.trajectory import sampling_refusal

__all__ = [
    "AlgorithmConfig", "GroupConfig", "InferenceConfig", "ModelConfig", "RolloutConfig", "RunConfig",
    "RunSection", "SandboxConfig", "ServiceSection", "SlurmConfig", "SpoolConfig", "TasksConfig", "TrainerConfig",
    "load_config", "config_from_dict", "parse_overrides", "to_dict", "iter_fields",
]


@section
class RunConfig:
    """Everything about one run. Each section belongs to one component."""

    run: RunSection = knob(factory=RunSection, doc="run identity and seed")
    model: ModelConfig = knob(factory=ModelConfig, doc="policy model and tokenizer")
    tasks: TasksConfig = knob(factory=TasksConfig, doc="task source and order")
    slurm: SlurmConfig = knob(factory=SlurmConfig, doc="Slurm job layout")
    spool: SpoolConfig = knob(factory=SpoolConfig, doc="the shared-filesystem spool")
    sandbox: SandboxConfig = knob(factory=SandboxConfig, doc="rootless sandboxes")
    rollout: RolloutConfig = knob(factory=RolloutConfig, doc="the rollout pipeline and agent")
    inference: InferenceConfig = knob(factory=InferenceConfig, doc="LLM servers and client")
    trainer: TrainerConfig = knob(factory=TrainerConfig, doc="the DeepSpeed trainer")
    algorithm: AlgorithmConfig = knob(factory=AlgorithmConfig, doc="the RL objective")
    service: ServiceSection = knob(factory=ServiceSection, doc="the rollout service job (rollout-server)")

    def check(self) -> list[str]:
        problems = []
        if self.inference.engine == "vllm" and self.slurm.infer.gpus_per_node % self.inference.tensor_parallel:
            problems.append(
                f"inference.tensor_parallel: {self.inference.tensor_parallel} does not divide "
                f"slurm.infer.gpus_per_node ({self.slurm.infer.gpus_per_node}); pick a divisor"
            )
        if self.algorithm.group_size == 1 and self.algorithm.drop_zero_variance:
            problems.append(
                "algorithm.group_size: 1 makes every group zero-variance, so drop_zero_variance would drop all; "
                "use group_size >= 2 or drop_zero_variance: false"
            )
        problems += self._sampling_problems() + self._length_problems() + cross_section_problems(self)
        if self.rollout.policy == "harness" and self.sandbox.runtime == "local":
            problems.append("rollout.policy: harness needs an isolated sandbox (the harness prefix and the gateway "
                            "socket are mounted into it); use sandbox.runtime: bwrap or apptainer")
        if self.trainer.precision == "bf16" and self.slurm.train.gpus_per_node == 0:
            problems.append(
                "trainer.precision: bf16 without GPUs (slurm.train.gpus_per_node: 0) is slow on CPU; "
                "use precision: fp32 for CPU runs"
            )
        return problems


    def _sampling_problems(self) -> list[str]:
        """Sampling the trainer cannot reproduce (the rule is hpc.trajectory.sampling_refusal)."""
        inf, problems = self.inference, []
        if why := sampling_refusal(inf.temperature):
            problems.append(f"inference.temperature: {why}; use a temperature > 0 (e.g. 0.7 or 1.0)")
        if why := sampling_refusal(1.0, inf.top_p):
            problems.append(f"inference.top_p: {why}; set it to 1.0")
        return problems

    def _length_problems(self) -> list[str]:
        r, problems = self.rollout, []
        if self.inference.max_model_len and r.max_tokens > self.inference.max_model_len:
            problems.append(f"rollout.max_tokens: {r.max_tokens} exceeds inference.max_model_len "
                            f"({self.inference.max_model_len}); lower rollout.max_tokens or raise max_model_len")
        if r.max_tokens > self.trainer.max_seq_len:
            problems.append(f"rollout.max_tokens: {r.max_tokens} exceeds trainer.max_seq_len ({self.trainer.max_seq_len})"
                            "; the trainer would drop the longest episodes as too_long: lower rollout.max_tokens or "
                            "raise trainer.max_seq_len")
        return problems



def config_from_dict(data: Mapping[str, Any]) -> RunConfig:
    """Validate plain data into a RunConfig; raise ConfigError listing every problem."""
    problems: list[str] = []
    if not isinstance(data, Mapping):
        raise ConfigError([f"(top level): expected a mapping of sections, got {type(data).__name__}"])
    cfg = build(RunConfig, data, "", problems)
    if problems:
        raise ConfigError(problems)
    return cfg


def parse_overrides(overrides: Sequence[str]) -> list[tuple[list[str], Any]]:
    """Parse ``a.b=value`` strings; values are YAML scalars or flow lists (``3``, ``true``, ``[a, b]``)."""
    parsed = []
    problems = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            problems.append(f"{item!r}: overrides look like section.key=value (e.g. trainer.lr=1e-5)")
            continue
        if (why := control_problem(key, raw)) is not None:  # YAML would fold a newline into a space
            problems.append(why)
            continue
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as exc:
            problems.append(f"{key}: cannot parse {raw!r} ({exc.__class__.__name__}); quote strings")
            continue
        parsed.append((key.split("."), value))
    if problems:
        raise ConfigError(problems)
    return parsed


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``data`` with dotted overrides applied (pure)."""
    out: dict[str, Any] = yaml.safe_load(yaml.safe_dump(data)) or {}
    problems = []
    for path, value in parse_overrides(overrides):
        node = out
        for i, part in enumerate(path[:-1]):
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                problems.append(f"{'.'.join(path[: i + 1])}: is a value, not a section; cannot set {'.'.join(path)}")
                break
            node = nxt
        else:
            node[path[-1]] = value
    if problems:
        raise ConfigError(problems)
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a config file; a missing or unparsable file is a ConfigError naming it."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read the config file ({exc.strerror}); check --config"]) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{p}: not valid YAML: {exc}"]) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{p}: the top level must be a mapping of sections, got {type(data).__name__}"])
    return data


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """``--config FILE`` plus ``key=value`` overrides -> a validated RunConfig."""
    data = read_yaml(path) if path is not None else {}
    if set(data) == {"config", "provenance"}:  # a run's frozen run.yaml (hpc.rundir) is a valid --config too
        data = data["config"] or {}
    return config_from_dict(apply_overrides(data, overrides))
