"""Test-suite policy shared by every tier.

Under CI (``CI=true``) a test marked as needing a real component (slurm, sandbox, apptainer,
deepspeed, vllm, e2e) may not skip silently: a skip there fails the run, unless its reason starts
with ``component unavailable:`` (the install script could not fetch the component and says why;
that reason is printed on its own line in the summary via ``-rs``). ``gpu`` tests skip with the
reason "no GPU on this machine", which holds here.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pluggy import Result

from tests import unprivileged

MUST_RUN_MARKERS = ("slurm", "sandbox", "apptainer", "deepspeed", "vllm", "e2e")
ACCEPTED_SKIP_PREFIX = "component unavailable:"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("gpu"):
            try:
                import torch

                has_gpu = torch.cuda.is_available()
            except ImportError:
                has_gpu = False
            if not has_gpu:
                item.add_marker(pytest.mark.skip(reason="no GPU on this machine"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
        item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Result[pytest.TestReport], None]:
    outcome = yield
    report = outcome.get_result()
    if not (_in_ci() and report.skipped):
        return
    markers = [m for m in MUST_RUN_MARKERS if item.get_closest_marker(m)]
    if not markers:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if reason.startswith(ACCEPTED_SKIP_PREFIX):
        return
    report.outcome = "failed"
    report.longrepr = (f"CI=true: test marked {markers} skipped without an accepted reason ({reason!r}). "
                       f"Install the component (see scripts/test.sh) or skip with '{ACCEPTED_SKIP_PREFIX} <why>'.")


@pytest.fixture(scope="session")
def rootless_home() -> Iterator[unprivileged.RootlessHome]:
    """The CI user's fresh HOME with the sandbox image built there without root, once per session
    (:func:`tests.unprivileged.rootless_home`): the rootless image test and the demo test share the build."""
    if os.geteuid() != 0:
        pytest.skip("component unavailable: running a child as the CI user needs the tests to run as root")
    yield from unprivileged.rootless_home()


RENDEZVOUS_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _rendezvous_stays_in_its_test() -> Iterator[None]:
    """Each test gets the rendezvous variables back as they were: defence in depth, no longer the fix.
    The fix is in :func:`train_node.trainer.engine.init_distributed`, which sets them only while the
    process group starts (:meth:`train_node.trainer.dist_env.DistEnv.exported`; checked by
    ``tests/trainer/test_dist_env.py``). Before it, a trainer run in this process left them in
    ``os.environ``, and a role a later test spawned took them for a launcher's and rendezvoused on the port
    the in-process group still held (EADDRINUSE: the harness demo's trainer after the gateway's on-policy
    test). ``LOCAL_RANK``, which DeepSpeed keeps for good, is restored here too."""
    before = {k: os.environ.get(k) for k in RENDEZVOUS_VARS}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
