"""Verbs of the rollout side: ``rollout-node``, ``rollout-server``, ``sandbox exec|shell``, ``tasks check``."""

from __future__ import annotations

from typing import Any

from hpc.cli_util import register_modules

MODULES = ("rollout_node.pipeline.cli", "rollout_node.service.cli", "rollout_node.sandbox.cli", "rollout_node.tasks.cli")


def register(sub: Any) -> None:
    register_modules(sub, MODULES)
