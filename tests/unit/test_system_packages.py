"""One system-package step for the quick start and CI: every tool the demo path calls comes from a package on
the demo's list (or from Debian's essential set), and the test list contains the demo list."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "system_packages.sh"
# tool -> the Debian package that provides it
PROVIDER = {"bwrap": "bubblewrap", "debootstrap": "debootstrap", "mmdebstrap": "mmdebstrap", "newuidmap": "uidmap",
            "git": "git",
            "patch": "patch", "apptainer": "apptainer", "shellcheck": "shellcheck", "ps": "procps"}
ESSENTIAL = {"bash", "env", "setsid", "tar", "chroot", "sed", "awk", "grep", "find", "chmod", "du", "cut", "date",
             "mkdir", "mv", "rm", "realpath", "dirname", "cat", "sha256sum", "id", "mktemp", "true", "dpkg", "apt-get",
             "dpkg-query", "setpriv"}  # setsid, setpriv: util-linux, Essential in Debian


def packages(path: str) -> list[str]:
    out = subprocess.run([str(SCRIPT), "--list", path], capture_output=True, text=True, check=True)
    return out.stdout.split()


def demo_tools() -> set[str]:
    """Tools the demo path runs: build_image.sh's checked commands and the argv heads/which() names in Python."""
    tools = set(re.findall(r"command -v (\w+)", (ROOT / "scripts" / "build_image.sh").read_text()))
    sources = [ROOT / "rollout_node" / "sandbox" / "runtimes.py", ROOT / "rollout_node" / "tasks" / "repos.py",
               ROOT / "rollout_node" / "sandbox" / "pty_shell.py", ROOT / "rollout_node" / "sandbox" / "spawner.py"]
    for src in sources:
        text = src.read_text()
        tools |= set(re.findall(r'shutil\.which\("([\w-]+)"\)', text))
        tools |= set(re.findall(r'\[\s*"(bwrap|git|patch|debootstrap|mmdebstrap)"', text))
    tools.add("git")  # run_git builds its argv from a constant
    return tools - {"apptainer"}  # the demo runs bwrap; apptainer is the cluster runtime


def missing_tools(demo: set[str]) -> dict[str, str | None]:
    return {t: PROVIDER.get(t) for t in demo_tools() - ESSENTIAL if PROVIDER.get(t) not in demo}


def test_every_demo_tool_is_on_the_demo_list() -> None:
    assert {"bwrap", "mmdebstrap", "newuidmap", "git"} <= demo_tools(), demo_tools()
    missing = missing_tools(set(packages("demo")))
    assert not missing, f"tools the demo path calls whose package is not in the demo list: {missing}"


def test_test_list_contains_the_demo_list_and_both_scripts_use_it() -> None:
    assert set(packages("demo")) <= set(packages("test"))
    assert 'system_packages.sh" demo' in (ROOT / "scripts" / "demo.sh").read_text()
    assert "system_packages.sh test" in (ROOT / "scripts" / "test.sh").read_text()
    assert "apt-get" not in (ROOT / "scripts" / "demo.sh").read_text()


def test_a_tool_dropped_from_the_list_is_caught(tmp_path: Path) -> None:
    text = SCRIPT.read_text().replace("DEMO_PACKAGES=(bubblewrap ", "DEMO_PACKAGES=(")
    broken = tmp_path / "system_packages.sh"
    broken.write_text(text)
    broken.chmod(0o755)
    out = subprocess.run([str(broken), "--list", "demo"], capture_output=True, text=True, check=True).stdout.split()
    assert missing_tools(set(out)) == {"bwrap": "bubblewrap"}
