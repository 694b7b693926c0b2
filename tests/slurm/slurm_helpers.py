"""Helpers for the Slurm integration tests (imported by conftest.py and the tests)."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hpc.config import RunConfig, load_config
from hpc.paths import RunPaths

SLURM_ROOT = Path(os.environ.get("SPOOLRL_SLURM_ROOT", "/var/lib/spoolrl-slurm"))
SHARED = SLURM_ROOT / "shared"
CI_USER = os.environ.get("SPOOLRL_SLURM_USER") or os.environ.get("SPOOLRL_CI_USER") or "spoolrl-ci"
FAKE_PYTHON = Path(__file__).with_name("fake_python.sh")


def ci_python_for(user: str) -> tuple[Path | None, str]:
    """(python, "") for a venv ``user`` can run that imports this checkout and the dev venv's packages,
    or (None, why not). The dev venv's interpreter may sit in root's mode-700 home, so the venv is
    made from the system python3 of the same version, with a .pth adding this venv's site-packages.
    Jobs of the end-to-end test can use it as ``slurm.<group>.python``."""
    base = Path("/usr/bin/python3")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    probe = subprocess.run([str(base), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != version:
        return None, f"no /usr/bin/python3 {version} to build the {user} venv from"
    venv = SHARED / "spoolrl-tests" / f"venv-{version}"
    venv.parent.mkdir(exist_ok=True)
    os.chmod(venv.parent, 0o1777)
    if not (venv / "bin" / "python").exists():
        subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
    pth = venv / "lib" / f"python{version}" / "site-packages" / "spoolrl-dev.pth"
    dirs = [d for d in site.getsitepackages() if Path(d).is_dir()]
    pth.write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in dirs))
    check = subprocess.run(["runuser", "-u", user, "--", str(venv / "bin" / "python"), "-c",
                            "import hpc.cli, submitit, yaml"], capture_output=True, text=True, timeout=120)
    if check.returncode != 0:
        return None, (f"{user} cannot import this checkout ({check.stderr.strip()[-200:]}); put the repository "
                      "and its venv where that user can read them")
    return venv / "bin" / "python", ""


def as_ci_user(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", CI_USER, "--", *cmd], capture_output=True, text=True,
                          timeout=120, **kw)  # type: ignore[call-overload]


def wait_for(what: str, check: Callable[[], object], timeout_s: float, poke_scheduler: bool = False) -> object:
    """Poll ``check`` until truthy. ``poke_scheduler``: Slurm 22.05's backfill (the only scheduler of
    het jobs) skips cycles in which no job/node/partition changed, so on an idle test cluster a
    requeued het job would wait for unrelated traffic; a no-op job update is that traffic."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if poke_scheduler:
            _poke_pending()
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for: {what}")


def _poke_pending() -> None:
    out = subprocess.run(["squeue", "-h", "-t", "PD", "-o", "%F"], capture_output=True, text=True).stdout
    for job_id in sorted(set(out.split())):
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "Comment=poke"], capture_output=True)


def fast_config(fake: Path, *extra: str) -> RunConfig:
    """1 train (gpu) + 1 infer (gpu) + 2 rollout (cpu) nodes, tiny resources, short drains."""
    overrides = [f"slurm.{g}.{k}={v}" for g in ("train", "infer", "rollout")
                 for k, v in (("python", str(fake)), ("mem_gb", 0.25), ("cpus_per_task", 1), ("drain_s", 10))]
    overrides += ["slurm.rollout.nodes=2", "slurm.time_limit_min=5", "slurm.rollout_restart_delay_s=1",
                  "slurm.stop_grace_s=10", "model.path=/nonexistent-model", "slurm.job_name=spoolrl-test"]
    return load_config(None, [*overrides, *extra])


def chown_to_ci(path: Path) -> None:
    subprocess.run(["chown", "-R", CI_USER, str(path)], check=True)


def make_run(path: Path, config: RunConfig) -> RunPaths:
    from hpc.rundir import create_run

    paths = create_run(path, config)
    (paths.root / "fake").mkdir()
    chown_to_ci(paths.root)
    return paths
