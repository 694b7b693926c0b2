"""Golden renders of the batch scripts: exact text, ``bash -n`` and shellcheck clean.

Regenerate after an intended change: ``SPOOLRL_UPDATE_GOLDEN=1 pytest tests/slurm/test_render.py``
and read the diff.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from fnmatch import fnmatch
from pathlib import Path

import pytest

from hpc.cli import main
from hpc.config import load_config
from hpc.render import (
    TEMPLATE_PACKAGE,
    TemplateError,
    fill,
    joined_text,
    load_template,
    render,
    render_scale,
    sbatch_quote,
    shell_quote,
)

GOLDEN = Path(__file__).parent / "golden"
NASTY_RUN = "/shared/runs/my run \"quoted\" it's 100% #1"
FULL = [
    "slurm.train.setup=['module load cuda/12.4', 'source /opt/envs/rl/bin/activate']",
    "slurm.train.sbatch_extra=['--account=proj42', '--qos=high', '--constraint=a100']",
    "slurm.train.nodes=2", "slurm.train.ntasks_per_node=4", "slurm.train.gpus_per_node=4",
    "slurm.infer.container=/images/vllm 0.8.sif", "slurm.infer.gpus_per_node=2",
    "slurm.rollout.nodes=8", "slurm.rollout.python=/opt/aarch64 env/bin/python3",
    "slurm.rollout.sbatch_extra=['--reservation=cpu-pool']",
    "slurm.job_name='rl agent #7'",
]
CASES = {
    "het_default": ([], "/shared/runs/r1"),
    "het_full_nasty_path": (FULL, NASTY_RUN),
    "separate": (["slurm.mode=separate", *FULL], NASTY_RUN),
    "no_requeue_no_rollout": (["slurm.requeue=false", "slurm.rollout.nodes=0"], "/shared/runs/r2"),
}


def _text(case: str) -> str:
    overrides, run = CASES[case]
    return joined_text(render(load_config(None, overrides), run, source="run.yaml"))


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("SPOOLRL_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with SPOOLRL_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(), f"render differs from {path}; if intended, regenerate (module docstring)"


def _scripts(text: str) -> list[str]:
    parts = re.split(r"^# ===== spoolrl job: \w+ =====\n", text, flags=re.M)
    return [p for p in parts if p]


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    _check_golden(case, _text(case))


def test_golden_scale() -> None:
    cfg = load_config(None, FULL)
    _check_golden("scale", render_scale(cfg, NASTY_RUN, 3).text)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bash_n_and_shellcheck(case: str, tmp_path: Path) -> None:
    for i, script in enumerate(_scripts(_text(case))):
        path = tmp_path / f"{case}-{i}.sbatch"
        path.write_text(script)
        subprocess.run(["bash", "-n", str(path)], check=True)
        if shutil.which("shellcheck") is None:
            pytest.fail("shellcheck is not installed (apt-get install shellcheck)")
        out = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout


def test_het_structure() -> None:
    text = _text("het_full_nasty_path")
    blocks = text.split("#SBATCH hetjob\n")
    assert len(blocks) == 3
    assert "--ntasks=8" in blocks[0] and "--gres=gpu:4" in blocks[0] and "--account=proj42" in blocks[0]
    assert "--signal=B:USR1@300" in blocks[0]  # group 0 (batch shell) is warned at the largest drain_s
    assert "--signal=USR1@60" in blocks[1] and "--signal=USR1@180" in blocks[2]
    assert "--reservation=cpu-pool" in blocks[2] and "--ntasks=8" in blocks[2]
    for i, role in enumerate(("train", "infer", "rollout")):
        assert len(re.findall(rf"srun --het-group={i} ", text)) == 1
        assert f"{role}-node" in text
    assert "apptainer exec --nv --bind \"$SPOOLRL_RUN\" '/images/vllm 0.8.sif'" in text
    assert '--if-missing --expect-digest "$SPOOLRL_CONFIG_DIGEST"' in text
    assert text.index("if ! (check_run_config); then") < text.index('start_step "$role"\ndone')


def test_separate_mode_is_one_script_per_role_without_hetjob() -> None:
    jobs = render(load_config(None, ["slurm.mode=separate"]), "/r")
    assert [j.name for j in jobs] == ["train", "infer", "rollout"]
    for job in jobs:
        assert "hetjob" not in job.text and "--het-group" not in job.text
        assert f"ROLES=({job.name})" in job.text
        assert f"slurm-{job.name}-%j.out" in job.text


def test_render_fails_on_missing_and_unused_values() -> None:
    with pytest.raises(TemplateError, match="nope"):
        fill("a {{nope}} b", {})
    with pytest.raises(TemplateError, match="extra"):
        fill("a {{x}}", {"x": "1", "extra": "2"})
    assert fill("a {{ x }}", {"x": "1"}) == "a 1"


def test_quoting_helpers() -> None:
    assert shell_quote("a b'c") == "'a b'\"'\"'c'"
    assert sbatch_quote("plain-value") == "plain-value"
    assert sbatch_quote('a "b" #c') == '"a \\"b\\" #c"'


def test_dry_run_prints_exactly_what_render_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("slurm:\n  rollout:\n    nodes: 3\n")
    run = str(tmp_path / "my run")
    out = tmp_path / "job.sbatch"
    assert main(["launch", "--config", str(config), "--dry-run", run, "slurm.time_limit_min=30"]) == 0
    printed = capsys.readouterr().out
    assert not Path(run).exists()  # a dry run creates nothing
    assert main(["render", "--config", str(config), "-o", str(out), run, "slurm.time_limit_min=30"]) == 0
    assert printed == out.read_text()
    assert "--time=30" in printed and "--nodes=3" in printed
    # render creates only RUN/logs/, where the script's #SBATCH --output points (Slurm creates no directory)
    assert [p.name for p in Path(run).iterdir()] == ["logs"] and not any(Path(run, "logs").iterdir())
    assert f"note: created {run}/logs/ for the job's Slurm output" in capsys.readouterr().err
    assert main(["render", "--config", str(config), "--run", run, "slurm.time_limit_min=30"]) == 0
    assert capsys.readouterr().out == printed


def test_templates_are_package_data() -> None:
    """A wheel (non-editable) install carries every template of the top-level ``sbatch_templates/``
    (a package of its own, found by the packaging config), so it renders the same script."""
    tomllib = pytest.importorskip("tomllib", reason="stdlib from Python 3.11 (CI runs 3.11)")
    from setuptools import find_packages

    root = Path(__file__).resolve().parents[2]
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert TEMPLATE_PACKAGE in find_packages(str(root), include=setuptools["packages"]["find"]["include"])
    patterns = setuptools["package-data"][TEMPLATE_PACKAGE]
    templates = sorted((root / TEMPLATE_PACKAGE).glob("*.tmpl"))
    assert templates
    for path in templates:
        assert any(fnmatch(path.name, pattern) for pattern in patterns), f"{path.name} is not package data"
        assert load_template(path.name) == path.read_text()
