"""One EVAL per distinct diff of a group (rollout_node.pipeline.evalshare): what is shared and what never is."""

from __future__ import annotations

import threading
import time

from hpc.trajectory import Status
from rollout_node.pipeline.bindings import EvalOutcome
from rollout_node.pipeline.evalshare import SharedEvals


class Runs:
    """A stand-in for the harness that counts its runs (the real harness runs in test_node_real.py)."""

    def __init__(self, outcome: EvalOutcome, delay_s: float = 0.0) -> None:
        self.outcome, self.delay_s, self.count = outcome, delay_s, 0
        self.lock = threading.Lock()

    def __call__(self) -> EvalOutcome:
        with self.lock:
            self.count += 1
        time.sleep(self.delay_s)
        return self.outcome


def test_identical_diffs_share_one_run_and_a_byte_of_difference_runs_again() -> None:
    evals, passed = SharedEvals(), Runs(EvalOutcome(1.0, Status.OK))
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"
    assert evals.evaluate(diff, passed) == (passed.outcome, False)
    assert evals.evaluate(diff, passed) == (passed.outcome, True)
    failed = Runs(EvalOutcome(0.0, Status.OK))
    outcome, shared = evals.evaluate(diff + " ", failed)  # one more byte: another tree, its own run
    assert (outcome.reward, shared, failed.count) == (0.0, False, 1)
    assert (passed.count, len(evals)) == (1, 2)


def test_an_infrastructure_failure_is_not_shared() -> None:
    evals = SharedEvals()
    broken = Runs(EvalOutcome(None, Status.HARNESS_ERROR, {"error": "sandbox did not start"}))
    assert evals.evaluate("d", broken) == (broken.outcome, False)
    fine = Runs(EvalOutcome(1.0, Status.OK))
    assert evals.evaluate("d", fine) == (fine.outcome, False), "the next sample with that diff evaluates anew"
    assert (broken.count, fine.count, len(evals)) == (1, 1, 1)


def test_a_timeout_is_conclusive_and_shared() -> None:
    """The harness's own verdict: no result frame is expected from a runner it stopped at the limit."""
    evals, slow = SharedEvals(), Runs(EvalOutcome(0.0, Status.TIMEOUT, {"results_read": False}))
    evals.evaluate("loop forever", slow)
    assert evals.evaluate("loop forever", slow) == (slow.outcome, True) and slow.count == 1


def test_concurrent_workers_wait_for_the_one_run() -> None:
    evals, run = SharedEvals(), Runs(EvalOutcome(1.0, Status.OK), delay_s=0.2)
    results: list[tuple[EvalOutcome, bool]] = []
    threads = [threading.Thread(target=lambda: results.append(evals.evaluate("same", run))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert run.count == 1
    assert sorted(shared for _, shared in results) == [False, True, True, True]


def test_groups_share_nothing() -> None:
    """Each group has its own table: a lucky pass of a flaky test is never replayed beyond its group."""
    lucky, unlucky = Runs(EvalOutcome(1.0, Status.OK)), Runs(EvalOutcome(0.0, Status.OK))
    SharedEvals().evaluate("flaky fix", lucky)
    assert SharedEvals().evaluate("flaky fix", unlucky) == (unlucky.outcome, False)


def test_a_result_not_read_in_full_stays_with_its_sample() -> None:
    """Only what the harness read in full is shared: a runner killed before its result frame (the step's
    SIGTERM reaches it before the node) must not become the reward of every sample that wrote the same fix."""
    evals = SharedEvals()
    cut = Runs(EvalOutcome(0.0, Status.OK, {"results_read": False}))
    whole = Runs(EvalOutcome(1.0, Status.OK, {"results_read": True}))
    assert evals.evaluate("fix", cut) == (cut.outcome, False)
    assert evals.evaluate("fix", whole) == (whole.outcome, False), "evaluated again"
    assert evals.evaluate("fix", whole) == (whole.outcome, True)
    assert (cut.count, whole.count) == (1, 1)

