"""The run config: defaults validate, every malformed config names its key and exits 2 before touching disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpc.config import RunConfig, config_from_dict, load_config
from hpc.config.render import commented_yaml
from hpc.errors import ConfigError

SPOOLRL = [sys.executable, "-m", "hpc.cli"]

# (yaml text or mapping, a substring every error message must contain)
MALFORMED: list[tuple[str | dict[str, Any], str]] = [
    ({"trainer": {"lr": "fast"}}, "trainer.lr"),
    ({"trainer": {"zero_stage": 4}}, "trainer.zero_stage"),
    ({"trainer": {"zero_stage": -1}}, "trainer.zero_stage"),
    ({"trainer": {"precision": "fp16"}}, "trainer.precision"),
    ({"trainer": {"total_steps": 0}}, "trainer.total_steps"),
    ({"trainer": {"checkpoint_every": 1.5}}, "trainer.checkpoint_every"),
    ({"trainer": {"prefetch": "yes please"}}, "trainer.prefetch"),
    ({"trainer": {"learning_rate": 1e-5}}, "trainer.learning_rate: unknown key"),
    ({"trainers": {}}, "trainers: unknown key"),
    ({"slurm": {"train": {"nodes": 0}}}, "slurm.train.nodes"),
    ({"slurm": {"infer": {"gpus": 2}}}, "slurm.infer.gpus: unknown key"),
    ({"slurm": {"rollout": {"mem_gb": 0}}}, "slurm.rollout.mem_gb"),
    ({"slurm": {"mode": "heterogeneous"}}, "slurm.mode"),
    ({"slurm": {"time_limit_min": 2}}, "slurm.time_limit_min"),
    ({"slurm": {"train": {"sbatch_extra": "--qos=high"}}}, "slurm.train.sbatch_extra"),
    ({"slurm": {"train": 3}}, "slurm.train"),
    ({"spool": {"poll_interval_s": 0}}, "spool.poll_interval_s"),
    ({"spool": {"heartbeat_interval_s": 400, "lease_s": 600}}, "spool.heartbeat_interval_s"),
    ({"sandbox": {"runtime": "docker"}}, "sandbox.runtime"),
    ({"sandbox": {"runtime": "local"}}, "sandbox.runtime"),
    ({"sandbox": {"mem_gb": -1}}, "sandbox.mem_gb"),
    ({"algorithm": {"clip_low": 1.5}}, "algorithm.clip_low"),
    ({"algorithm": {"group_size": 1}}, "algorithm.group_size"),
    ({"algorithm": {"advantage_norm": "none"}}, "algorithm.advantage_norm"),
    ({"inference": {"engine": "vllm", "tensor_parallel": 3}}, "inference.tensor_parallel"),
    ({"inference": {"top_p": 2}}, "inference.top_p"),
    ({"rollout": {"max_turns": 0}}, "rollout.max_turns"),
    # sampling the trainer cannot reproduce, and lengths it would drop (issue: one distribution end to end)
    ({"inference": {"temperature": 0}}, "inference.temperature: temperature 0"),
    ({"inference": {"top_p": 0.9}}, "inference.top_p: top_p 0.9"),
    ({"rollout": {"max_tokens": 5000}, "inference": {"max_model_len": 4096}}, "inference.max_model_len (4096)"),
    ({"rollout": {"max_tokens": 9000}}, "exceeds trainer.max_seq_len (8192)"),
    ({"rollout": {"max_staleness": 2}}, "rollout.max_staleness: unknown key"),
    ({"algorithm": {"truncated": "drop"}}, "algorithm.truncated"),
    ({"algorithm": {"timeout": "ignore"}}, "algorithm.timeout"),
    ({"run": {"seed": "abc"}}, "run.seed"),
    ({"run": {"seed": True}}, "run.seed"),
    ({"model": {"path": None}}, "model.path"),
    ("- just\n- a list\n", "top level"),
    ("trainer: [1, 2\n", "not valid YAML"),
]


def _cpu(data: dict) -> dict:
    """The CPU-valid baseline (fp32 without GPUs) under ``data``."""
    base: dict = {"trainer": {"precision": "fp32"}, "slurm": {"train": {"gpus_per_node": 0}}}
    for k, v in data.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return base


def test_defaults_validate_and_round_trip() -> None:
    text = commented_yaml(RunConfig())
    data = yaml.safe_load(text)
    assert config_from_dict(data) == RunConfig()
    assert "# DeepSpeed ZeRO stage" in text  # field docs are in the default config


@pytest.mark.parametrize("case", range(len(MALFORMED)))
def test_malformed_config_names_key_and_exits_2(case: int, tmp_path: Path) -> None:
    data, expected = MALFORMED[case]
    cfg = tmp_path / "run.yaml"
    cfg.write_text(data if isinstance(data, str) else yaml.safe_dump(_cpu(data)))
    run_dir = tmp_path / "run"
    out = subprocess.run([*SPOOLRL, "init", str(run_dir), "--config", str(cfg)], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert expected in out.stderr
    assert not run_dir.exists(), "nothing may be created on disk for an invalid config"


def test_all_problems_reported_together() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(_cpu({"trainer": {"lr": "x", "zero_stage": 9}, "spool": {"bogus": 1}}))
    assert len(err.value.problems) == 3
    assert any("valid keys here:" in p and "poll_interval_s" in p for p in err.value.problems)


def test_overrides_apply_and_keep_section_defaults() -> None:
    cfg = load_config(None, ["slurm.rollout.nodes=3", "trainer.precision=fp32", "slurm.train.gpus_per_node=0"])
    assert cfg.slurm.rollout.nodes == 3
    assert cfg.slurm.rollout.partition == "cpu"  # the rest of the section keeps its defaults
    assert cfg.trainer.precision == "fp32"


@pytest.mark.parametrize("bad", ["trainer.lr", "=3", "trainer..lr=1", "trainer.lr.x=1"])
def test_bad_overrides(bad: str) -> None:
    with pytest.raises(ConfigError):
        load_config(None, [bad, "trainer.precision=fp32", "slurm.train.gpus_per_node=0"])


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    out = subprocess.run([*SPOOLRL, "validate", "--config", str(tmp_path / "nope.yaml")], capture_output=True,
                         text=True)
    assert out.returncode == 2
    assert "cannot read the config file" in out.stderr


def test_config_default_cli_output_validates(tmp_path: Path) -> None:
    out = subprocess.run([*SPOOLRL, "config", "default"], capture_output=True, text=True, check=True)
    (tmp_path / "d.yaml").write_text(out.stdout)
    ok = subprocess.run([*SPOOLRL, "validate", "--config", str(tmp_path / "d.yaml")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


def test_exponent_without_dot_is_a_number(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("trainer:\n  lr: 1e-5\n  precision: fp32\nslurm:\n  train:\n    gpus_per_node: 0\n")
    assert load_config(tmp_path / "r.yaml", ["algorithm.kl_coef=2E-3"]).trainer.lr == 1e-5
    with pytest.raises(ConfigError, match="trainer.lr"):
        load_config(tmp_path / "r.yaml", ["trainer.lr=1e-5x"])


@pytest.mark.parametrize("verb", [["validate"], ["render"], ["launch", "--dry-run"], ["demo", "--steps", "1"]])
def test_untrainable_sampling_is_refused_by_every_verb_before_anything_starts(verb: list[str], tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    args = [*SPOOLRL, *verb, "inference.temperature=0", "inference.top_p=0.5"]
    if verb[0] == "demo":
        args += ["--out", str(out_dir)]
    out = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "inference.top_p: top_p 0.5" in out.stderr and "set it to 1.0" in out.stderr
    assert "inference.temperature: temperature 0" in out.stderr
    assert list(tmp_path.iterdir()) == [], "nothing may be created for a refused config"


@pytest.mark.parametrize("verb", [["validate"], ["render"], ["launch", "--dry-run"], ["init", "RUNDIR"],
                                  ["demo", "--steps", "1"]])
def test_unsupported_chat_template_is_refused_before_anything_starts(verb: list[str], tmp_path: Path) -> None:
    model = tmp_path / "mistral"
    model.mkdir()
    (model / "chat_template.jinja").write_text("{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}")
    work = tmp_path / "work"
    work.mkdir()
    args = [*SPOOLRL, *[str(work / "run") if v == "RUNDIR" else v for v in verb], f"model.path={model}",
            "trainer.precision=fp32", "slurm.train.gpus_per_node=0"]
    if verb[0] == "demo":
        args += ["--out", str(work / "demo")]
    out = subprocess.run(args, capture_output=True, text=True, cwd=work, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "model.path" in out.stderr and "(chatml, llama3)" in out.stderr
    assert list(work.iterdir()) == [], "nothing may be created for a refused model"


def test_the_demo_checks_its_paths_as_every_verb_does(tmp_path: Path) -> None:
    """The demo runs the shared check (hpc.cli.util.check_job): a model or task file that is not here stops it."""
    out = subprocess.run([*SPOOLRL, "demo", "--steps", "1", "--out", str(tmp_path / "demo"), "model.path=/nowhere/model",
                          "tasks.source=/nowhere/tasks.jsonl"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "model.path: /nowhere/model does not exist here" in out.stderr, out.stderr
    assert "tasks.source: /nowhere/tasks.jsonl does not exist here" in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == [], "nothing may be created for a refused config"


@pytest.mark.parametrize("verb", [["validate"], ["render"], ["launch", "--dry-run"], ["init", "RUNDIR"]])
def test_a_model_dir_not_visible_here_is_an_error_unless_it_is_on_the_cluster(
        verb: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from hpc.cli import main

    monkeypatch.chdir(tmp_path)
    args = [*[str(tmp_path / "run") if v == "RUNDIR" else v for v in verb], "model.path=/nowhere/model",
            "trainer.precision=fp32", "slurm.train.gpus_per_node=0"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "model.path: /nowhere/model does not exist here" in err and "--paths-on-cluster" in err, err
    assert list(tmp_path.iterdir()) == []
    assert main([*args, "--paths-on-cluster"]) == 0
    assert "not checked here (--paths-on-cluster): model.path=/nowhere/model" in capsys.readouterr().err
