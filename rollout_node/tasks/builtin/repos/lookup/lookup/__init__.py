"""The lookup package: VALUE (lookup/config.py) is read by the code that needs the setting."""

from lookup.config import VALUE

__all__ = ["VALUE"]
