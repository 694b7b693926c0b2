"""Run directories: layout, provenance, layout-version check, resume refusal for unsafe keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpc.config import load_config
from hpc.errors import RunDirError
from hpc.paths import RunPaths
from hpc.rundir import check_resume, create_run, open_run, read_provenance

CPU = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0"]


def test_create_writes_layout_config_and_provenance(tmp_path: Path) -> None:
    cfg = load_config(None, CPU)
    paths = create_run(tmp_path / "run", cfg)
    for d in paths.directories():
        assert d.is_dir(), d
    assert paths.secret.stat().st_mode & 0o077 == 0, "the per-run secret is private to its owner"
    _, loaded = open_run(paths.root)
    assert loaded == cfg
    prov = read_provenance(paths.root)
    assert prov["spoolrl_version"]
    assert "torch" in prov["packages"] and "numpy" in prov["packages"]
    assert "model_hash" in prov and "tokenizer_hash" in prov


def test_model_hash_recorded_for_a_model_dir(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    paths = create_run(tmp_path / "run", load_config(None, [*CPU, f"model.path={model}"]))
    assert len(read_provenance(paths.root)["model_hash"]) == 64


def test_existing_run_refused_without_if_missing(tmp_path: Path) -> None:
    cfg = load_config(None, CPU)
    create_run(tmp_path / "run", cfg)
    with pytest.raises(RunDirError, match="already holds a run"):
        create_run(tmp_path / "run", cfg)
    assert create_run(tmp_path / "run", cfg, if_missing=True).root == (tmp_path / "run").absolute()


def test_layout_version_checked(tmp_path: Path) -> None:
    paths = create_run(tmp_path / "run", load_config(None, CPU))
    paths.layout_file.write_text("99\n")
    with pytest.raises(RunDirError, match="layout version 99"):
        open_run(paths.root)


def test_not_a_run_dir(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="not a spoolrl run directory"):
        open_run(tmp_path)


def test_resume_allows_safe_keys_and_names_unsafe_ones() -> None:
    old = load_config(None, CPU)
    assert check_resume(old, load_config(None, [*CPU, "slurm.rollout.nodes=8", "trainer.total_steps=500"])) == [
        "slurm.rollout.nodes", "trainer.total_steps"]
    with pytest.raises(RunDirError, match=r"algorithm.clip_high: 0.28 -> 0.5"):
        check_resume(old, load_config(None, [*CPU, "algorithm.clip_high=0.5"]))


def test_if_missing_with_changed_unsafe_key_refuses(tmp_path: Path) -> None:
    create_run(tmp_path / "run", load_config(None, CPU))
    with pytest.raises(RunDirError, match="trainer.lr"):
        create_run(tmp_path / "run", load_config(None, [*CPU, "trainer.lr=0.1"]), if_missing=True)


def test_nonempty_foreign_dir_refused(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(RunDirError, match="not empty"):
        create_run(tmp_path, load_config(None, CPU))


def test_run_yaml_is_plain_yaml(tmp_path: Path) -> None:
    paths = create_run(tmp_path / "run", load_config(None, CPU))
    data = yaml.safe_load(RunPaths(paths.root).run_yaml.read_text())
    assert set(data) == {"config", "provenance"}


def test_frozen_run_yaml_is_a_valid_config_for_init_if_missing(tmp_path: Path) -> None:
    cfg = load_config(None, CPU)
    paths = create_run(tmp_path / "run", cfg)
    assert load_config(paths.run_yaml) == cfg
    assert create_run(paths.root, load_config(paths.run_yaml), if_missing=True) == paths
