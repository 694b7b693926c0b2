"""spoolrl's shared core: what every node shares and what faces the cluster. Imports no torch.

The core knows no role: outside :mod:`hpc.cli` (the command line, the one place that may import
``rollout_node`` and ``train_node``) nothing here imports a role or the face
(``tests/unit/test_layering.py``).
"""

__version__ = "0.1.0"
