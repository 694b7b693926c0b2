#!/usr/bin/env python3
"""``spoolrl demo`` with a forced staleness: the bench-only wrapper of ``scripts/bench_learning.py --staleness``.

    .venv/bin/python scripts/stale_demo.py --lag K [--no-is-weight] -- [spoolrl demo arguments ...]

The demo's three roles run as its local jobs do, each through :func:`role`, which patches the role's own
process before the verb starts (nothing in the library carries a knob for this; STYLE rule 16):
- infer-node: the servers load policy version ``LATEST - K`` (:class:`LaggedSource`), never a newer one, so
  every sample of a step trained at version v was drawn by version v - K (version 0, the initial model,
  until v reaches K). Retention must keep K + 1 versions: run it with ``trainer.keep_policies`` > K.
- rollout-node: the staleness guard's EVAL margin is 0. The margin anticipates versions the trainer publishes
  while an episode's EVAL runs; in the regime this is for (one step's tasks outstanding, no prefetch) it
  publishes none, and with ``algorithm.max_staleness`` = K the estimated margin alone (at least 1 as soon as a
  version rate is seen) would cancel every episode drawn K versions behind. With the margin at 0 the guard
  cancels exactly the episodes drawn before a server's reload (K + 1 behind), which restart on the lagged
  version: every trained sample is exactly K old.
- train-node, ``--no-is-weight`` only: the loss applies no importance weight (w = 1: plain REINFORCE with the
  baseline on stale samples); the logged ratio statistics (``ratio_dev``, ``truncated_fraction``,
  ``by_staleness``) stay those of pi/mu, what the weight would have corrected; ``weight_mean`` reads 1.

Functions defined here are pickled by value into the roles (submitit uses cloudpickle, and this file runs as
``__main__``), so the roles need nothing importable from ``scripts/``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class LaggedSource:
    """A policy source that names the version ``lag`` behind the one ``inner`` names (None at or below 0: the
    servers keep the initial model)."""

    def __init__(self, inner: Any, lag: int) -> None:
        self.inner, self.lag = inner, lag

    def latest(self) -> Any:
        from train_node.infer.weights import PolicyRef

        ref = self.inner.latest()
        if ref is None or ref.version - self.lag <= 0:
            return None
        version = ref.version - self.lag
        path = self.inner.paths.policy_version(version)
        return PolicyRef(version, path) if (path / "config.json").exists() else None


def without_is_weight(policy_loss: Any) -> Any:
    """``policy_loss`` with the importance weight forced to 1; its sums keep the ratio statistics of pi/mu."""
    import dataclasses

    @functools.wraps(policy_loss)
    def loss(logp: Any, behaviour_logp: Any, advantages: Any, mask: Any, **kw: Any) -> Any:
        on_policy = logp.detach() if kw.get("prox_logp") is None else kw["prox_logp"]
        value, applied = policy_loss(logp, on_policy, advantages, mask, **kw)  # mu := pi_prox, so w = 1
        seen = policy_loss(logp.detach(), behaviour_logp, advantages, mask,
                           **{**kw, "forward_kl_tokens": _detached(kw.get("forward_kl_tokens"))})[1]
        return value, dataclasses.replace(seen, loss=applied.loss, weight=applied.weight, b_weight=applied.b_weight)

    return loss


def _detached(t: Any) -> Any:
    return None if t is None else t.detach()


def role(argv: list[str], *, lag: int, is_weight: bool) -> int:
    """The body of each role's local job: patch this process for its role, then run the verb as the demo does."""
    verb = argv[0]
    if verb == "infer-node" and lag:
        from train_node.infer import node
        from train_node.infer.weights import RunDirPolicySource

        def lagged(run_dir: str | Path) -> LaggedSource:
            return LaggedSource(RunDirPolicySource(run_dir), lag)

        node.RunDirPolicySource = lagged  # type: ignore[misc,assignment]  # a patch: node only calls .latest()
    if verb == "rollout-node" and lag:
        from rollout_node.pipeline.staleness import StalenessGuard

        StalenessGuard.margin = lambda self: 0  # type: ignore[method-assign]
    if verb == "train-node" and not is_weight:
        from train_node.trainer import engine

        engine.policy_loss = without_is_weight(engine.policy_loss)  # type: ignore[assignment]
    from hpc.cli.demo_run import run_role

    return run_role(argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lag", type=int, required=True, help="versions the servers stay behind LATEST (>= 0)")
    parser.add_argument("--no-is-weight", action="store_true", help="train without the importance weight")
    parser.add_argument("demo", nargs=argparse.REMAINDER, help="-- then spoolrl demo's arguments")
    args = parser.parse_args(argv)
    if args.lag < 0:
        parser.error("--lag must be >= 0")
    from hpc.cli import demo_run
    from hpc.cli import main as spoolrl

    demo_run.run_role = functools.partial(role, lag=args.lag, is_weight=not args.no_is_weight)  # type: ignore[assignment]
    rest = args.demo[1:] if args.demo[:1] == ["--"] else args.demo
    return spoolrl(["demo", *rest])


if __name__ == "__main__":
    sys.exit(main())
