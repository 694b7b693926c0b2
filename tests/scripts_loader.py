"""Import one of ``scripts/*.py`` (benchmarks and their helpers are files, not a package) as a module, once per
test process: the module is registered in ``sys.modules`` under its file name before it runs, so dataclasses and
pickles inside it resolve their own module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as the module ``name`` (the one already loaded, if any)."""
    if (loaded := sys.modules.get(name)) is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec and spec.loader, f"no scripts/{name}.py"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
