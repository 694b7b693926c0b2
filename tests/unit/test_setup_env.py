"""``scripts/setup_env.sh`` installs nothing into a venv whose stamp says it is set up (issue 38: the quick
start's ``scripts/demo.sh`` runs it as the unprivileged user on the suite's venv): the same extras, or for
the demo path (``--no-dev``: train + report) a venv set up with the dev extras, which hold report's packages.
Anything else reinstalls; here the venv's python is a stub that fails, so an install shows as its message
and exit 1 without touching the network."""

from __future__ import annotations

import ast
import hashlib
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "setup_env.sh"
DIGEST = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()
                        + (ROOT / "scripts" / "constraints-cpu.txt").read_bytes()).hexdigest()[:16]


def setup_env(venv: Path, stamp: str, *flags: str) -> subprocess.CompletedProcess[str]:
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 1\n")  # any pip install fails at once
    python.chmod(0o755)
    (venv / ".spoolrl-stamp").write_text(stamp + "\n")
    tmp = venv.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    out = subprocess.run([str(SCRIPT), *flags], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "SPOOLRL_VENV": str(venv), "TMPDIR": str(tmp)},
                         stdin=subprocess.DEVNULL)
    assert list(tmp.iterdir()) == [], "setup_env.sh left its pip log behind"
    return out


@pytest.mark.parametrize(("stamp", "flags"), [(f"{DIGEST}-train,dev", []), (f"{DIGEST}-train,report", ["--no-dev"]),
                                              (f"{DIGEST}-train,dev", ["--no-dev"])])
def test_a_venv_set_up_for_the_path_is_used_as_it_is(tmp_path: Path, stamp: str, flags: list[str]) -> None:
    out = setup_env(tmp_path / "venv", stamp, *flags)
    assert out.returncode == 0 and "installing" not in out.stderr, out.stderr
    assert (tmp_path / "venv" / ".spoolrl-stamp").read_text().strip() == stamp


@pytest.mark.parametrize(("stamp", "flags", "extras"), [
    (f"{DIGEST}-train,report", [], "train,dev"),  # the tests need more than the demo's venv has
    (f"{'0' * 16}-train,dev", ["--no-dev"], "train,report"),  # pyproject.toml or the constraints changed
])
def test_anything_else_is_installed(tmp_path: Path, stamp: str, flags: list[str], extras: str) -> None:
    out = setup_env(tmp_path / "venv", stamp, *flags)
    assert out.returncode == 1 and f"installing spoolrl[{extras}]" in out.stderr and "pip failed" in out.stderr, out


def extra(name: str) -> set[str]:
    """The requirements of one extra in pyproject.toml (its list may wrap over lines)."""
    found = re.search(rf"^{name} = (\[.*?\])", (ROOT / "pyproject.toml").read_text(), flags=re.M | re.S)
    assert found, name
    return set(ast.literal_eval(found.group(1)))


def test_the_dev_extra_holds_the_report_extra() -> None:
    assert extra("report") and extra("report") <= extra("dev"), (extra("report"), extra("dev"))


def test_check_installs_nothing_and_says_why(tmp_path: Path) -> None:
    """``--check`` (what ``scripts/test.sh`` runs under ``SPOOLRL_SKIP_SETUP=1``): 0 for a venv set up for this
    checkout; 1 naming the stamps and the fix for a stale one, and for none at all, installing nothing."""
    assert setup_env(tmp_path / "ok", f"{DIGEST}-train,dev", "--check").returncode == 0
    stale = setup_env(tmp_path / "stale", f"{'0' * 16}-train,dev", "--check")
    assert stale.returncode == 1 and "installing" not in stale.stderr, stale.stderr
    assert f"stamp '{'0' * 16}-train,dev', this checkout wants '{DIGEST}-train,dev'" in stale.stderr, stale.stderr
    assert "run scripts/setup_env.sh" in stale.stderr
    none = subprocess.run([str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "SPOOLRL_VENV": str(tmp_path / "none")},
                          stdin=subprocess.DEVNULL)
    assert none.returncode == 1 and "no virtual environment at" in none.stderr, none.stderr
    assert not (tmp_path / "none").exists()
