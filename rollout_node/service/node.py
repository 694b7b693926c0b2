"""A rollout node serving the API: the pipeline's :class:`~rollout_node.pipeline.node.RolloutNode`
unchanged (claims from the run's spool, INIT -> RUN -> EVAL, groups written to shards, leases,
cancellation, drain), with :class:`~rollout_node.service.policy.ServicePolicy` as its policy and, as
its episode notes (:data:`~rollout_node.pipeline.outcomes.EpisodeNotes`), the episode's diff kept on
the trajectory as ``git_patch`` for the API's answer.

Guarantee: a service node is a rollout node in every other respect (same sandboxes, tasks code,
limits, fault table and exactly-once spool rules), so any number of them, on any hosts, serve one
front door by sharing its run directory.
"""

from __future__ import annotations

import os

from hpc.config import RunConfig
from hpc.errors import UsageError
from hpc.paths import RunPaths, node_scratch, private_dir
from hpc.rundir import open_run
from hpc.spool import RolloutSpool, Spool
from rollout_node.pipeline.bindings import RealTaskOps, TaskOps
from rollout_node.pipeline.control import JobClock
from rollout_node.pipeline.episode import Episode
from rollout_node.pipeline.node import NodeOptions, RolloutNode
from rollout_node.pipeline.policy import Policy
from rollout_node.pipeline.sizing import default_workers


def service_notes(ep: Episode, worker_id: str) -> None:
    """What the API answers with besides the trajectory: the diff evaluated (ProRL's ``git_patch``)
    and the node that ran the episode."""
    ep.metrics["node"] = worker_id
    if ep.diff:
        ep.metrics["git_patch"] = ep.diff


class ServiceNode(RolloutNode):
    """A ``RolloutNode`` with :func:`service_notes` as its episode notes."""

    def __init__(self, paths: RunPaths, config: RunConfig, spool: RolloutSpool, ops: TaskOps, policy: Policy,
                 options: NodeOptions, job_clock: JobClock | None = None) -> None:
        super().__init__(paths, config, spool, ops, policy, options, job_clock, notes=service_notes)


def build_service_node(run: str, node_id: str, *, policy: Policy | None = None,
                       ops: TaskOps | None = None) -> ServiceNode:
    """Wire a service node on ``run`` (the same parts ``spoolrl rollout-node`` builds)."""
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


def make_service_policy(paths: RunPaths, config: RunConfig) -> Policy:
    """The LLM agent, or the configured harness behind the node's gateway (``rollout.policy: harness``),
    with least-assigned balancing over RUN/endpoints (backends the API registers); requests carry the
    run secret as every run-dir client's do (``InferenceClient.from_config``)."""
    from rollout_node.service.policy import LeastAssignedClient, ServiceHarnessPolicy, ServicePolicy

    client = LeastAssignedClient.from_config(config.inference, run_dir=paths.root)
    if config.rollout.policy == "harness":
        from rollout_node.pipeline.harness import build_harness_policy

        return build_harness_policy(paths, config, client=client, cls=ServiceHarnessPolicy)
    return ServicePolicy(paths, config, client=client)
