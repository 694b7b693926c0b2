"""The rollout node: sandboxes, tools, the agent loop, tasks and the INIT -> RUN -> EVAL pipeline.

Imports no torch, nothing of ``train_node`` and not the CLI face ``hpc.cli`` (its verbs live there);
of ``hpc`` it uses the shared core only (``tests/unit/test_layering.py``).
"""
