"""EVAL's in-sandbox pytest runner. Its SOURCE is what runs: ``python3 -I -B -c BOOT SOURCE MARKER KEYFILE FILE...``.

Stdlib + pytest only (it runs in the task's image, never imports spoolrl). What makes its results
trustworthy, in the order it runs (no code of the tree runs before step 6):

1. The per-run key is read from ``KEYFILE`` (written into the tree by the harness just before the
   run) and the file is unlinked: from then on the key exists only in this process's memory.
2. The real stdout is duplicated to a private descriptor; ``MARKER`` is printed.
3. pytest, every ``_pytest``/``pluggy`` submodule and the stdlib modules pytest imports lazily are
   imported while the tree is NOT on ``sys.path``: no file of the tree can stand in for them.
4. The runner is snapshotted: every function, class, descriptor and module bound in the dicts of
   the runner's modules (pytest, ``_pytest``, pluggy and their helpers, ``unittest``, this runner)
   and of their classes, by identity.
5. An audit hook and an import guard are installed; they refuse, and record as violations, from
   the tree's non-test code: ``sys._getframe`` / ``inspect`` frame access, traceback and generator
   frame access, ``__code__`` writes, ``gc`` object walks, trace/profile hooks, ``sys._current_frames``,
   imports of ``_pytest``/``pluggy``; and from anyone: ``ctypes``, ``/proc/*/mem``.
6. The tree joins ``sys.path``; ``pytest.main`` runs with the recorder plugin, which stores each
   report's outcome and, at that moment, checks the snapshot and the registered plugins (a plugin
   whose code lives in the tree's non-test files is a violation).
7. One frame goes to the private descriptor: ``spoolrl-results-v1 <HMAC-SHA256(key, body)> <len>``,
   then the body (ASCII lines, test ids hex-encoded), then ``os._exit``: no atexit hook of the tree
   runs after it. The harness verifies the HMAC; text the tree prints cannot pose as a frame.
"""

import builtins
import os
import sys

TAG = "spoolrl-results-v1"
FILENAME = "<spoolrl-eval-runner>"
BOOT = f"import sys; exec(compile(sys.argv.pop(1), {FILENAME!r}, 'exec'))"
PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "exceptiongroup", "tomli", "py", "attr")
WATCHED = ("__main__", "unittest")
LAZY_STDLIB = ("tomllib", "unittest", "unittest.mock", "doctest", "pdb", "xml.etree.ElementTree", "difflib",
               "pprint", "textwrap", "shlex", "argparse", "fnmatch", "inspect", "tempfile", "traceback", "warnings",
               "importlib.metadata", "importlib.util", "zipimport", "json", "hmac", "hashlib", "decimal", "fractions",
               "dataclasses", "glob", "platform", "string", "tokenize", "ast", "bdb", "cmd", "code", "codeop",
               "faulthandler", "logging", "locale", "gettext", "sqlite3", "threading", "signal", "socket", "select")
FRAME_ATTRS = ("tb_frame", "gi_frame", "cr_frame", "ag_frame")
GUARDED_IMPORTS = ("_pytest", "pluggy")


def _is_test_path(rel):
    parts = rel.split("/")
    name = parts[-1]
    return ("tests" in parts[:-1] or name == "conftest.py"
            or (name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))))


class Guard:
    """Decides which code is the tree's (untrusted) and records violations."""

    def __init__(self, root):
        self.root = root.rstrip("/") + "/"
        self.violations = []
        self.inspect_file = ""
        self.busy = False

    def untrusted(self, filename):
        if not filename:
            return False
        if filename.startswith("<"):
            return not (filename == FILENAME or filename.startswith(("<frozen", "<attrs generated")))
        return filename.startswith(self.root) and not _is_test_path(filename[len(self.root):])

    def where(self, frame):
        """The file that decides an event: the caller, seen through the ``inspect`` module."""
        while frame is not None and frame.f_code.co_filename == self.inspect_file:
            frame = frame.f_back
        return frame.f_code.co_filename if frame is not None else ""

    def refuse(self, what):
        self.violations.append(what)
        raise RuntimeError(f"spoolrl EVAL: refused {what}")

    def audit(self, event, args):
        if self.busy:
            return
        if event.startswith("ctypes.") or (event == "import" and str(args[0]).split(".")[0] in ("ctypes", "_ctypes")):
            self.refuse(f"{event} (ctypes is not allowed during EVAL)")
        if event == "open" and isinstance(args[0], str) and args[0].startswith("/proc/") and \
                args[0].endswith("/mem"):
            self.refuse(f"open {args[0]}")
        risky = event in ("sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
                          "gc.get_objects", "gc.get_referrers", "gc.get_referents")
        risky = risky or (event == "object.__getattr__" and args[1] in FRAME_ATTRS)
        risky = risky or (event == "object.__setattr__" and args[1] == "__code__")
        if not risky:
            return
        self.busy = True
        try:
            filename = self.where(sys._getframe(1))
        finally:
            self.busy = False
        if self.untrusted(filename):
            name = args[1] if event.startswith("object.") else ""
            self.refuse(f"{event} {name} from {filename}".replace("  ", " "))


def _preimport():
    import importlib
    import pkgutil

    for name in LAZY_STDLIB:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - absent from this image: nothing to shadow
            pass
    import pytest  # noqa: F401

    for pkg in PACKAGES:
        try:
            mod = importlib.import_module(pkg)
        except Exception:  # noqa: BLE001
            continue
        for info in pkgutil.walk_packages(getattr(mod, "__path__", []), pkg + "."):
            try:
                importlib.import_module(info.name)
            except Exception:  # noqa: BLE001 - optional parts (e.g. a Windows-only module)
                pass


def _runner_modules():
    mods = [m for n, m in list(sys.modules.items()) if m is not None and
            any(n == p or n.startswith(p + ".") for p in PACKAGES + WATCHED)]
    return sorted(set(mods), key=lambda m: m.__name__)


def _watched(value):
    return callable(value) or isinstance(value, (property, classmethod, staticmethod, type(sys)))


def snapshot():
    """(module, attr) and (module, class, attr) -> the bound object, for every watched binding."""
    snap: dict = {}
    for mod in _runner_modules():
        for key, value in list(vars(mod).items()):
            if _watched(value):
                snap[(mod.__name__, key)] = value
            if isinstance(value, type) and value.__module__ == mod.__name__:
                for ckey, cvalue in list(vars(value).items()):
                    if _watched(cvalue):
                        snap[(mod.__name__, key, ckey)] = cvalue
    return snap


def changes(snap):
    """(name, new object or None) of watched bindings that are no longer the snapshot's object, and of
    methods added to watched classes."""
    found = []
    classes = {}
    for key, value in snap.items():
        mod = sys.modules.get(key[0])
        owner = mod if len(key) == 2 else getattr(mod, key[1], None)
        if len(key) == 3:
            classes[(key[0], key[1])] = owner
        space = vars(owner) if owner is not None and hasattr(owner, "__dict__") else {}
        if space.get(key[-1], None) is not value:
            found.append((".".join(key), space.get(key[-1], None)))
    for (mname, cname), cls in classes.items():
        if cls is None or not hasattr(cls, "__dict__"):
            continue
        for ckey, cvalue in list(vars(cls).items()):
            if _watched(cvalue) and (mname, cname, ckey) not in snap:
                found.append((f"{mname}.{cname}.{ckey} (added)", cvalue))
    return found


def origin(value):
    """The file that defines ``value`` (a function, descriptor, partial or class), else ''."""
    for attr in ("fget", "__func__", "func"):
        value = getattr(value, attr, value)
    code = getattr(value, "__code__", None)
    if code is not None:
        return code.co_filename
    if isinstance(value, type):
        return getattr(sys.modules.get(value.__module__), "__file__", "") or ""
    return ""


def runner_dirs():
    dirs = []
    for name in PACKAGES:
        mod = sys.modules.get(name)
        path = getattr(mod, "__file__", None)
        if path:
            dirs.append(os.path.dirname(path) + "/" if hasattr(mod, "__path__") else path)
    return tuple(dirs)


class Recorder:
    """The pytest plugin: outcomes of every report, checked against the snapshot when they arrive."""

    def __init__(self, guard, snap):
        self.guard, self.snap = guard, snap
        self.lines = []
        self.flagged = set()
        self.config: object = None

    def pytest_configure(self, config):
        """Runs last: what pytest's own plugins changed while configuring (e.g. ``legacypath``) is
        accepted when the new object is defined in the runner's packages; then the snapshot is retaken."""
        self.config = config
        trusted = runner_dirs()
        for name, value in changes(self.snap):
            file = origin(value) if value is not None else ""
            if not (file.startswith(trusted) and not self.guard.untrusted(file)):
                self.flag(name)
        self.snap = snapshot()
        self.check()

    def flag(self, what):
        if what not in self.flagged:
            self.flagged.add(what)
            self.guard.violations.append(f"runner modified: {what}")

    def check(self):
        for name, _ in changes(self.snap):
            self.flag(name)
        if self.config is not None:
            for found in self.foreign_plugins():
                self.flag(found)

    def foreign_plugins(self):
        found = []
        for plugin in getattr(self.config, "pluginmanager").get_plugins():  # noqa: B009
            filename = getattr(plugin, "__file__", None) or getattr(sys.modules.get(type(plugin).__module__),
                                                                    "__file__", None)
            if isinstance(filename, str) and self.guard.untrusted(filename):
                found.append(f"plugin registered from {filename}")
        return found

    def pytest_runtest_logreport(self, report):
        xfail = "1" if hasattr(report, "wasxfail") else "0"
        self.lines.append(f"R {report.when} {report.outcome} {xfail} {report.nodeid.encode('utf-8', 'replace').hex()}")
        self.check()

    def pytest_sessionfinish(self, session):
        self.check()  # before unconfigure, which undoes what pytest's own plugins changed
        self.lines.append(f"F {session.testscollected}")

    def pytest_collectreport(self, report):
        if report.failed:
            self.lines.append(f"C {report.outcome} {report.nodeid.encode('utf-8', 'replace').hex()}")
        self.check()


def main(argv):
    marker, keyfile, files = argv[1], argv[2], argv[3:]
    with open(keyfile, "rb") as f:
        key = f.read().strip()
    os.unlink(keyfile)
    import _hashlib

    digest, write, exit_ = _hashlib.hmac_digest, os.write, os._exit
    out = os.dup(1)
    print(marker, flush=True)
    _preimport()
    import inspect

    import pytest

    root = os.getcwd()
    guard = Guard(root)
    guard.inspect_file = inspect.__file__
    real_import = builtins.__import__

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        importer = (globals or {}).get("__file__") or ""
        if level == 0 and name.split(".")[0] in GUARDED_IMPORTS and guard.untrusted(importer):
            guard.refuse(f"import {name} from {importer}")
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = guarded_import
    setattr(Recorder, "pytest_configure", pytest.hookimpl(trylast=True)(Recorder.pytest_configure))  # noqa: B010
    recorder = Recorder(guard, {})
    recorder.snap = snapshot()
    sys.addaudithook(guard.audit)
    sys.path.insert(0, root)
    code = pytest.main(["-rA", "-v", "-p", "no:cacheprovider", "--color=no", "--tb=short", f"--rootdir={root}",
                        "--continue-on-collection-errors", *files], plugins=[recorder])
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:  # pytest's report (for humans) goes out before the frame; os._exit does not flush
            stream.flush()  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - a stream the tree replaced or closed
            pass
    lines = [*recorder.lines, *(f"V {v.encode('utf-8', 'replace').hex()}" for v in guard.violations),
             f"E {int(code)} {len(recorder.lines)}"]
    body = ("\n".join(lines) + "\n").encode("ascii")
    header = f"\n{TAG} {digest(key, body, 'sha256').hex()} {len(body)}\n".encode("ascii")
    view = memoryview(header + body)
    while view:
        view = view[write(out, view):]
    exit_(0)


if __name__ == "__main__":
    main(sys.argv)
