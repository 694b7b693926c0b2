"""The GPU side: everything that loads model weights (trainer and inference serving).

Imports nothing of ``rollout_node`` and not the CLI face ``hpc.cli`` (its verbs live there); of ``hpc``
it uses the shared core only (``tests/unit/test_layering.py``).
"""
