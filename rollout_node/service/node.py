"""A rollout node serving the API: the pipeline's :class:`~rollout_node.pipeline.node.RolloutNode`
unchanged (claims from the run's spool, INIT -> RUN -> EVAL, groups written to shards, leases,
cancellation, drain), with :class:`~rollout_node.service.policy.ServicePolicy` as its policy and the
episode's diff kept on the trajectory as ``git_patch`` for the API's answer.

Guarantee: a service node is a rollout node in every other respect (same sandboxes, tasks code,
limits, fault table and exactly-once spool rules), so any number of them, on any hosts, serve one
front door by sharing its run directory.
"""

from __future__ import annotations

import os
from typing import Any

from hpc.trajectory import Status
from rollout_node.pipeline.episode import Episode
from rollout_node.pipeline.node import NodeOptions, RolloutNode


class ServiceNode(RolloutNode):
    """``RolloutNode`` that records the diff it evaluated (ProRL's ``git_patch``) and its worker id."""

    def _complete(self, ep: Episode, status: Status, reward: float | None) -> None:
        ep.metrics["node"] = self.worker_id
        if ep.diff:
            ep.metrics["git_patch"] = ep.diff
        super()._complete(ep, status, reward)


def build_service_node(run: str, node_id: str, *, policy: Any = None, ops: Any = None) -> ServiceNode:
    """Wire a service node on ``run`` (the same parts ``spoolrl rollout-node`` builds)."""
    from hpc.errors import UsageError
    from hpc.paths import node_scratch, private_dir
    from hpc.rundir import open_run
    from hpc.spool import Spool
    from rollout_node.pipeline.bindings import RealTaskOps
    from rollout_node.pipeline.sizing import default_workers

    paths, config = open_run(run)
    try:  # the same private scratch rule as rollout-node (a squatted directory is refused)
        scratch = private_dir(node_scratch(config.sandbox.scratch_dir) / f"spoolrl-rollout-{os.getuid()}")
    except PermissionError as exc:
        raise UsageError(f"rollout node scratch is unusable: {exc}; set sandbox.scratch_dir to a directory "
                         "of your own") from exc
    options = NodeOptions(node_id=node_id, workers=default_workers(config.rollout, config.sandbox, scratch),
                          scratch=scratch)
    return ServiceNode(paths, config, Spool(paths.root, config.spool), ops or RealTaskOps(paths, config),
                       policy or make_service_policy(paths, config), options)


def make_service_policy(paths: Any, config: Any) -> Any:
    """The LLM agent, or the configured harness behind the node's gateway (``rollout.policy: harness``),
    with least-assigned balancing over RUN/endpoints (backends the API registers); requests carry the
    run secret as every run-dir client's do (``InferenceClient.from_config``)."""
    from rollout_node.service.policy import LeastAssignedClient, ServiceHarnessPolicy, ServicePolicy

    client = LeastAssignedClient.from_config(config.inference, run_dir=paths.root)
    if config.rollout.policy == "harness":
        from rollout_node.pipeline.harness import build_harness_policy

        return build_harness_policy(paths, config, client=client, cls=ServiceHarnessPolicy)
    return ServicePolicy(paths, config, client=client)
