"""spoolrl's shared core: what every node shares and what faces the cluster. Imports no torch."""

__version__ = "0.1.0"
