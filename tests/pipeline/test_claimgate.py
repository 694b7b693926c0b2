"""The claim gate asks the policy what it lacks only through ``ReportsReadiness`` (``not_ready()``):
a policy without it never holds claims back, one with it does while it answers a reason."""

from __future__ import annotations

from pathlib import Path

from hpc.config import load_config
from hpc.slurm_env import SlurmEnv
from rollout_node.pipeline.claimgate import ClaimGate
from rollout_node.pipeline.control import JobClock
from rollout_node.pipeline.metrics import NodeMetrics
from rollout_node.pipeline.policy import EpisodeContext, EpisodeOutput, Policy, ReportsReadiness


class Plain:
    def run_episode(self, ctx: EpisodeContext) -> EpisodeOutput:
        raise AssertionError("not run here")

    def close(self) -> None:
        pass


class Waiting(Plain):
    def __init__(self) -> None:
        self.reason = "no_inference_server"

    def not_ready(self) -> str:
        return self.reason


def gate(tmp_path: Path, policy: Policy) -> ClaimGate:
    return ClaimGate(load_config(None, []), lambda: 0, policy, JobClock(SlurmEnv.from_environ({})),
                     NodeMetrics(tmp_path, "n0"))


def test_only_a_policy_that_reports_readiness_holds_claims_back(tmp_path: Path) -> None:
    assert not isinstance(Plain(), ReportsReadiness) and isinstance(Waiting(), ReportsReadiness)
    assert gate(tmp_path, Plain()).reason(0, None) == ""
    waiting = Waiting()
    g = gate(tmp_path, waiting)
    assert g.reason(0, None) == "no_inference_server"
    waiting.reason = ""
    assert g.reason(0, None) == ""
    assert g.reason(3, 3) == "max_episodes"  # the policy is asked after the node's own share
