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
