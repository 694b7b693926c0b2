"""The inference role: a lightweight CPU engine, the vLLM supervisor (``spoolrl infer-node``), tiny models.

Both engines speak the same token-in/token-out subset of vLLM's ``/v1/completions`` (processed logprobs,
integer weight-version spans) and pass the same contract tests (``tests/infer/test_contract.py``).
Weight-changing endpoints require the per-run secret. GPU vLLM cannot run in CPU CI; how it is
validated on clusters is in ``docs/inference.md`` (section "Validating GPU vLLM on a cluster").

Importing this package imports no torch; ``engine``/``server`` do. The verbs (``serve``, ``tiny-model``,
``infer-node``, ``model from-gguf``) are in :mod:`hpc.cli.infer` and :mod:`hpc.cli.model`.
"""

from train_node.infer.tiny import build_tiny_model

__all__ = ["build_tiny_model"]
