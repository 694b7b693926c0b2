"""``spoolrl demo`` says which role died and of what: a local job's state is FINISHED whether its verb returned
or raised, so the job's result decides (a trainer that died at its start was reported as 'role errors: none')."""

from __future__ import annotations

import time
from pathlib import Path

import submitit

from hpc.cli.demo_run import RoleJobs, role_errors, run_role


def test_a_role_whose_verb_failed_is_named_with_its_error(tmp_path: Path) -> None:
    executor = submitit.LocalExecutor(folder=tmp_path)
    executor.update_parameters(timeout_min=2)
    jobs = RoleJobs({"train-node": executor.submit(run_role, ["validate", "no.such_key=1"])})
    deadline = time.monotonic() + 120
    while not all(j.done() for j in jobs.jobs.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert jobs.jobs["train-node"].state == "FINISHED"  # (the roles that ended well: the e2e demo tests)
    assert role_errors(jobs) == {"train-node": "FailedJobError: RuntimeError: spoolrl validate no.such_key=1 exited "
                                               "with status 2"}


def test_a_second_interrupt_during_the_drain_still_cancels_every_role(tmp_path: Path) -> None:
    """Ctrl-C starts the drain (STOP marker, up to grace_s for the roles to end); a second Ctrl-C (or a SIGTERM)
    during it cut the wait short before the roles were cancelled, and they kept running, orphaned."""
    import os
    import signal
    import threading

    from hpc.cli.demo_run import stop_roles
    from hpc.paths import RunPaths

    executor = submitit.LocalExecutor(folder=tmp_path / "logs")
    executor.update_parameters(timeout_min=10)
    jobs = RoleJobs({"rollout-node": executor.submit(time.sleep, 300)})  # a role that ignores the STOP marker
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # (nohup and CI start with it ignored)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    try:
        timer.start()
        t0 = time.monotonic()
        try:
            stop_roles(RunPaths(tmp_path / "run"), jobs, grace_s=60.0)
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the second interrupt did not reach the drain")
        assert time.monotonic() - t0 < 30, "the drain waited out its grace instead of being interrupted"
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    try:
        deadline = time.monotonic() + 30
        while not jobs.jobs["rollout-node"].done() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert jobs.jobs["rollout-node"].done(), "the role was left running after the interrupted drain"
    finally:
        jobs.cancel()  # (the test leaves nothing running when it fails)
