"""Bad values are refused before anything starts: NaN/Inf in every numeric key, control
characters in every string key (they are written into batch scripts), bind paths containing
',' or ':', a run directory that cannot be written into a script. Each exits 2 naming the key,
through the real CLI, and creates nothing."""

from __future__ import annotations

import subprocess
import sys
import time
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpc.config import RunConfig, iter_fields, load_config
from hpc.errors import ConfigError, SandboxError
from rollout_node.sandbox.runtimes import ApptainerRuntime, LaunchSpec

SPOOLRL = [sys.executable, "-m", "hpc.cli"]
CPU = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0"]
INJECT = "x\necho INJECTED #"


def _leaf_types(tp: Any) -> set[Any]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list:
        return {("list", a) for a in args}
    if typing.get_origin(tp) is dict:
        return {("dict", args[1])}
    return set(args) if args and typing.get_origin(tp) is not typing.Literal else {tp}


def numeric_keys() -> list[str]:
    return [k for k, _f, tp in iter_fields(RunConfig) if _leaf_types(tp) & {int, float}]


def string_keys() -> list[tuple[str, str]]:
    """(key, shape) for every free-text string key: shape "str", "list" or "dict" (of strings)."""
    out = []
    for key, _f, tp in iter_fields(RunConfig):
        kinds = _leaf_types(tp)
        for shape, kind in (("str", str), ("list", ("list", str)), ("dict", ("dict", str))):
            if kind in kinds:
                out.append((key, shape))
    return out


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load_config(None, [*CPU, *overrides])
    return err.value.problems


def test_the_key_lists_cover_the_schema() -> None:
    assert {"spool.lease_s", "sandbox.mem_gb", "trainer.lr", "slurm.train.mem_gb"} <= set(numeric_keys())
    assert {("slurm.job_name", "str"), ("slurm.train.setup", "list"), ("slurm.rollout.partition", "str"),
            ("sandbox.scratch_dir", "str"), ("rollout.harness.env", "dict")} <= set(string_keys())


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1e999"])
def test_non_finite_numbers_are_refused_in_every_numeric_key(value: str) -> None:
    for key in numeric_keys():
        problems = _problems([f"{key}={value}"])
        assert any(p.startswith(f"{key}:") for p in problems), (key, problems)


def test_control_characters_are_refused_in_every_string_key() -> None:
    for key, shape in string_keys():
        for bad in (INJECT, "a\rb", "a\x1b[2Jb", "a\x00b"):
            # a YAML flow value with the escape
            value = {"str": repr(bad), "list": repr([bad]), "dict": repr({"K": bad})}[shape]
            problems = _problems([f"{key}={value.replace(chr(39), chr(34))}"])
            assert any(p.startswith(key) and "control character" in p for p in problems), (key, bad, problems)
    assert load_config(None, [*CPU, "slurm.train.setup=['module load\\tcuda']"])  # a tab is fine


def test_an_alias_bomb_in_a_wrong_type_gives_a_short_message(tmp_path: Path) -> None:
    levels = ["&a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 6) + "]" for i in range(1, 30)]  # 9 * 6**29 leaves
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text("run:\n  seed: [" + ", ".join(levels) + "]\n")
    t0 = time.monotonic()
    out = subprocess.run([*SPOOLRL, "validate", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "run.seed" in out.stderr, out.stderr[-500:]
    assert len(out.stderr) < 5_000 and time.monotonic() - t0 < 30


def test_apptainer_scratch_with_a_bind_separator_is_refused() -> None:
    problems = _problems(["sandbox.runtime=apptainer", "sandbox.scratch_dir=/scratch/a:b"])
    assert any(p.startswith("sandbox.scratch_dir:") for p in problems)
    assert load_config(None, [*CPU, "sandbox.scratch_dir=/scratch/a:b"])  # bwrap takes separate arguments
    spec = LaunchSpec(workdir=Path("/tmp/x,y/work"), image=Path("/img"), scratch=Path("/tmp/x,y"))
    with pytest.raises(SandboxError, match="separators"):
        ApptainerRuntime("apptainer").argv(spec, ["true"])


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPOOLRL, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("verb", ["validate", "render", "launch"])
@pytest.mark.parametrize("data, key", [({"spool": {"lease_s": float("nan")}}, "spool.lease_s"),
                                       ({"sandbox": {"mem_gb": float("inf")}}, "sandbox.mem_gb"),
                                       ({"slurm": {"job_name": INJECT}}, "slurm.job_name"),
                                       ({"slurm": {"rollout": {"partition": "cpu\n#SBATCH --x"}}},
                                        "slurm.rollout.partition")])
def test_cli_exits_2_naming_the_key_and_creates_nothing(verb: str, data: dict, key: str, tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(data))
    work = tmp_path / "w"
    work.mkdir()
    extra = {"validate": [], "render": ["--run", str(work / "run"), "-o", str(work / "job.sbatch")],
             "launch": ["--run", str(work / "run")]}[verb]
    out = _cli(verb, "--config", str(cfg), *extra, *CPU, cwd=work)
    assert out.returncode == 2 and key in out.stderr, (out.returncode, out.stderr[-2000:])
    assert list(work.iterdir()) == [], "nothing was created"


def test_an_override_value_with_a_control_character_names_the_key(tmp_path: Path) -> None:
    out = _cli("validate", *CPU, 'slurm.job_name="x\\necho INJECTED"', "spool.lease_s=.nan", cwd=tmp_path)
    assert out.returncode == 2 and "slurm.job_name" in out.stderr and "spool.lease_s" in out.stderr, out.stderr


@pytest.mark.parametrize("run_name, extra, why", [("a\nb", [], "control character"),
                                                  ("a\tb", [], "control character"),
                                                  ("a:b", ["slurm.train.container=/img/t.sif"], "separators"),
                                                  ("a,b", ["slurm.rollout.container=/img/r.sif"], "separators")])
def test_render_refuses_a_run_dir_it_cannot_write(run_name: str, extra: list[str], why: str, tmp_path: Path) -> None:
    for verb in ("render", "launch"):
        out = _cli(verb, "--run", str(tmp_path / run_name), *CPU, *extra, "--paths-on-cluster", cwd=tmp_path)
        assert out.returncode == 2 and "RUN:" in out.stderr and why in out.stderr, out.stderr[-2000:]
        assert list(tmp_path.iterdir()) == []


def test_run_directories_are_private_whatever_the_umask(tmp_path: Path) -> None:
    import os
    import stat
    run = tmp_path / "run"
    out = subprocess.run([*SPOOLRL, "init", str(run), *CPU, "model.path=/nonexistent", "--paths-on-cluster"],
                         capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.umask(0o002), stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    dirs = [run, *(p for p in run.iterdir() if p.is_dir())]
    assert {"control", "spool", "endpoints", "checkpoints", "policy"} <= {p.name for p in dirs}
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in dirs} == {p.name: 0o700 for p in dirs}
    assert stat.S_IMODE((run / "control" / "secret").stat().st_mode) == 0o600
