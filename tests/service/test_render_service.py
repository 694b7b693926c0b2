"""The rollout-only service job (``spoolrl render --service``): golden text, ``bash -n`` and
shellcheck clean with a nasty run path, the step runs ``rollout-server`` on every task, with
``--trust-network`` from ``service.trust_network``; a bad CIDR is refused naming the key or flag."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hpc.cli import main
from hpc.config import load_config
from hpc.render import render_service

GOLDEN = Path(__file__).parent / "golden" / "service.sbatch"
NASTY_RUN = "/shared/runs/my run \"quoted\" it's 100% #1"
OVERRIDES = ["slurm.rollout.nodes=3", "slurm.rollout.ntasks_per_node=2", "slurm.rollout.python=/opt/my env/bin/python3",
             "service.trust_network=10.0.0.0/8, fd00::/8"]


def _text() -> str:
    return render_service(load_config(None, OVERRIDES), NASTY_RUN, source="run.yaml").text


def test_golden_service_job() -> None:
    if os.environ.get("SPOOLRL_UPDATE_GOLDEN"):
        GOLDEN.write_text(_text())
    assert _text() == GOLDEN.read_text(), "render differs; if intended: SPOOLRL_UPDATE_GOLDEN=1 and review the diff"


def test_service_job_is_clean_shell(tmp_path: Path) -> None:
    path = tmp_path / "service.sbatch"
    path.write_text(_text())
    subprocess.run(["bash", "-n", str(path)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed (apt-get install shellcheck)")
    out = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_service_job_shape() -> None:
    text = _text()
    assert "#SBATCH hetjob" not in text and "--ntasks=6" in text and "ROLES=(service)" in text
    assert "rollout-server --host 0.0.0.0 --port 0 --run \"$SPOOLRL_RUN\" --trust-network 10.0.0.0/8,fd00::/8" in text
    assert "rollout-node" not in text.split("ROLES=(service)", 1)[1].split("# Contract", 1)[0]


def test_render_cli_service_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["render", "--service", "--run", str(tmp_path / "r"), *OVERRIDES, "--paths-on-cluster"]) == 0
    out = capsys.readouterr().out
    assert "spoolrl-service" in out and "rollout-server" in out and "train-node" not in out.split("# Contract")[0]


def test_no_trusted_network_no_flag() -> None:
    text = render_service(load_config(None, OVERRIDES[:3]), NASTY_RUN).text
    assert "--trust-network" not in text and 'rollout-server --host 0.0.0.0 --port 0 --run "$SPOOLRL_RUN"\'' in text


def test_bad_cidr_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["render", "--service", "--run", str(tmp_path / "r"), "service.trust_network=10.0.0.1/8"]) != 0
    err = capsys.readouterr().err
    assert "service.trust_network" in err and "host bits" in err and "10.0.0.0/8" in err
    assert main(["rollout-server", "--trust-network", "10.0.0.0/33", "--run", str(tmp_path / "s")]) != 0
    err = capsys.readouterr().err
    assert "--trust-network" in err and "10.0.0.0/33" in err and not (tmp_path / "s").exists()
