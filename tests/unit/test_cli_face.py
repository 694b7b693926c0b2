"""The CLI face: every verb is registered (verb names are a contract), and ``python -m hpc.cli`` loads it once."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from hpc.cli import VERB_MODULES, build_parser

REPO = Path(__file__).resolve().parents[2]

VERBS: dict[str, dict[str, Any]] = {
    "demo": {}, "warm-start": {}, "report": {},
    "config": {"default": {}}, "validate": {}, "init": {}, "spool": {"stats": {}, "inspect": {}},
    "render": {}, "launch": {}, "status": {}, "cancel": {}, "resume": {}, "scale": {},
    "rollout-node": {}, "rollout-server": {}, "sandbox": {"exec": {}, "shell": {}},
    "harness": {"install": {}, "check": {}}, "tasks": {"check": {}},
    "train-node": {}, "checkpoints": {}, "serve": {}, "tiny-model": {}, "infer-node": {},
    "model": {"from-gguf": {}},
}


def _verbs(parser: argparse.ArgumentParser) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[name] = _verbs(sub)
    return out


def test_every_verb_is_registered_in_order() -> None:
    found = _verbs(build_parser())
    assert found == VERBS
    assert list(found) == list(VERBS)  # the order of --help


def test_verb_modules_live_in_the_face() -> None:
    assert all(m.__name__.startswith("hpc.cli.") for m in VERB_MODULES)


def test_python_m_loads_the_face_once_without_a_role() -> None:
    code = ("import runpy, sys; sys.argv = ['spoolrl', '--version']\n"
            "try:\n    runpy.run_module('hpc.cli', run_name='__main__', alter_sys=True)\n"
            "except SystemExit:\n    pass\n"
            "roles = sorted(m for m in sys.modules if m.split('.')[0] in ('rollout_node', 'train_node', 'torch'))\n"
            "print(repr(roles), sys.modules['hpc.cli'].__file__)")
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.startswith("spoolrl ")
    roles, face = out.stdout.splitlines()[-1].split(" ", 1)
    assert roles == "[]", "--version (and --help) must not import a role or torch"
    # A package run by its __main__.py: the module 'python -m' executes is not a second copy of hpc.cli
    # (a plain hpc/cli.py run as __main__ and imported again by a verb module would be).
    assert face.endswith("hpc/cli/__init__.py") and (REPO / "hpc" / "cli" / "__main__.py").is_file()
    assert not (REPO / "hpc" / "cli.py").exists()
