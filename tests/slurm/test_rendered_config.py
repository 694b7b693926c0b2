"""What was rendered is what runs: the script embeds the resolved config and its digest, the
job's first act (the script's own ``check_run_config``, run here by bash exactly as rendered)
creates a missing RUN from it and refuses a RUN frozen with another config, naming the keys; the
hint ``render`` prints reproduces its overrides."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from hpc.config import load_config
from hpc.rundir import config_digest, open_run

REPO = Path(__file__).resolve().parents[2]
SPOOLRL = [sys.executable, "-m", "hpc.cli"]
BASE = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "model.path=/nonexistent",
        f"slurm.train.python={sys.executable}"]
OVERRIDES = ["trainer.total_steps=4", "algorithm.group_size=2", "run.name=it's a run"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPOOLRL, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def _render(tmp_path: Path, run: Path, *extra: str) -> tuple[str, str]:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"trainer": {"lr": 2e-5}}))
    out = _cli("render", "--config", str(cfg), "--run", str(run), "-o", str(tmp_path / "job.sbatch"), *BASE,
               *OVERRIDES, *extra, "--paths-on-cluster", cwd=tmp_path)  # model.path: a path no host has
    assert out.returncode == 0, out.stderr
    return (tmp_path / "job.sbatch").read_text(), out.stderr


def _check_run_config(script: str) -> subprocess.CompletedProcess[str]:
    """The script's values, functions and config check, without the Slurm steps."""
    head = script[: script.index("trap on_warning USR1")]
    return subprocess.run(["bash", "-c", head + "\ncheck_run_config\n"], capture_output=True, text=True,
                          timeout=120, cwd=REPO, stdin=subprocess.DEVNULL)


def test_the_script_records_the_digest_of_the_resolved_config(tmp_path: Path) -> None:
    script, _ = _render(tmp_path, tmp_path / "run")
    expected = config_digest(load_config(str(tmp_path / "run.yaml"), [*BASE, *OVERRIDES]))
    assert f"# Config: {expected} " in script and f"export SPOOLRL_CONFIG_DIGEST={expected}\n" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_the_printed_hint_reproduces_the_overrides(tmp_path: Path) -> None:
    run = tmp_path / "run"
    script, note = _render(tmp_path, run)
    hint = shlex.split(note.split("create it now with: ", 1)[1].strip())
    assert hint[:2] == ["spoolrl", "init"]
    out = subprocess.run([*SPOOLRL, *hint[1:]], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    _, frozen = open_run(run)
    assert (frozen.trainer.total_steps, frozen.algorithm.group_size, frozen.trainer.lr) == (4, 2, 2e-5)
    assert _check_run_config(script).returncode == 0, "the job accepts the run its own hint created"


def test_a_missing_run_is_created_from_the_embedded_config(tmp_path: Path) -> None:
    run = tmp_path / "run"
    script, _ = _render(tmp_path, run)
    out = _check_run_config(script)
    assert out.returncode == 0, out.stderr
    _, frozen = open_run(run)
    assert f"SPOOLRL_CONFIG_DIGEST={config_digest(frozen)}\n" in script


def test_a_run_frozen_with_another_config_is_refused_naming_the_keys(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert _cli("init", str(run), *BASE, "--paths-on-cluster", cwd=tmp_path).returncode == 0  # total_steps 100
    script, _ = _render(tmp_path, run)
    out = _check_run_config(script)
    assert out.returncode == 2, out.stderr
    for key in ("algorithm.group_size", "trainer.lr"):
        assert key in out.stderr, out.stderr
    assert open_run(run)[1].trainer.total_steps == 100, "a refused job changes nothing"


def test_resumable_differences_are_accepted(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _check_run_config(_render(tmp_path, run)[0])
    script = _render(tmp_path, run, "slurm.rollout.nodes=3", "trainer.total_steps=6")[0]
    out = _check_run_config(script)
    assert out.returncode == 0, out.stderr
    _, frozen = open_run(run)
    assert (frozen.slurm.rollout.nodes, frozen.trainer.total_steps) == (3, 6), "the rendered values now run"
    assert f"SPOOLRL_CONFIG_DIGEST={config_digest(frozen)}\n" in script


def test_an_edited_embedded_config_is_refused(tmp_path: Path) -> None:
    script, _ = _render(tmp_path, tmp_path / "run")
    assert "  total_steps: 4\n" in script
    out = _check_run_config(script.replace("  total_steps: 4\n", "  total_steps: 5\n"))
    assert out.returncode == 2 and "edited" in out.stderr, out.stderr
    assert not (tmp_path / "run" / "run.yaml").exists()  # no run (render made only logs/, for sbatch's --output)
