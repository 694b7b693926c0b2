"""Verbs of the GPU side: ``train-node``, ``checkpoints``, ``infer-node``, ``serve``, ``tiny-model``, ``model``."""

from __future__ import annotations

from typing import Any

from hpc.cli_util import register_modules

MODULES = ("train_node.trainer.cli", "train_node.infer.cli", "train_node.infer.model_cli")


def register(sub: Any) -> None:
    register_modules(sub, MODULES)
