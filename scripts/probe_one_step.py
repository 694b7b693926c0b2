#!/usr/bin/env python3
"""How far does one optimizer step move the demo's policy? The trainer's DeepSpeed step against plain AdamW.

Why this exists: through the loop the demo's policy puts most of its mass on one value for every
statement after its first trainer step, while the in-process probe (scripts/probe_pick_learning.py)
was read only every 5-10 steps. This takes one batch of policy-version-0 groups that a demo run
committed (one group per requested value, whole groups of ``algorithm.group_size``), trains it once
with the trainer's :class:`~train_node.trainer.engine.Engine` (the demo's precision, ZeRO stage,
micro-batches, forward KL) and once with a plain ``torch.optim.AdamW`` step on the token-mean
policy gradient, and prints P(each value | each requested value) before and after both.

    scripts/probe_one_step.py RUN [--lr 3e-4] [--eps 1e-8] [--micro-batch-tokens 1024]

Measured (twelfth session, the demo's warm start, a balanced batch with 1, 1, 4 and 3 of 8 correct):
the two steps agree to the printed digits (grad norm 0.0783 both), and one step at lr 3e-4 moves the
rows from [0.25 ...] to ~0.84 on `first` for every statement; lr 1e-4: 0.57, lr 3e-5: 0.36 (from
0.25). A larger AdamW eps (plain step only): 1e-5 0.80, 1e-4 0.66, 1e-3 0.41. So the trainer computes
what it should; one step of this size swings the statement-independent part of the value logits, and
samples 1-2 versions stale keep pushing after the swing.
"""

from __future__ import annotations

import argparse
import collections
import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a demo run directory whose spool still holds committed shards")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--eps", type=float, default=1e-8, help="AdamW eps of the plain step (the trainer's stays 1e-8)")
    ap.add_argument("--micro-batch-tokens", type=int, default=1024)
    args = ap.parse_args()

    import numpy as np
    import torch

    from hpc.config import load_config
    from hpc.shard import read_shard_file, table_trajectories
    from rollout_node.agent.prompts import SYSTEM_PROMPTS
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.tasks import load_tasks
    from rollout_node.tasks.builtin.pick import VALUES, answer_of
    from rollout_node.tasks.builtin.warm import value_prefix
    from train_node.infer.warm import choice_probabilities, format_rows, rows_by_answer
    from train_node.trainer.dist_env import resolve
    from train_node.trainer.engine import Engine, init_distributed, load_model
    from train_node.trainer.loss import group_advantages
    from train_node.trainer.packing import Sample, plan_step

    run_cfg = load_config(args.run / "run.yaml", [])
    model_dir, temperature = run_cfg.model.path, run_cfg.inference.temperature
    tasks = {t.instance_id: t for t in load_tasks(run_cfg.tasks.source)}
    groups: dict[str, list] = collections.defaultdict(list)
    for shard in sorted((args.run / "spool" / "shards").glob("*/*.shard")):
        for traj in table_trajectories(read_shard_file(shard), str(shard)):
            own = traj.loss_mask == 1
            if own.any() and int(traj.policy_versions[own].max()) == 0:
                groups[str(traj.task_id)].append(traj)
    batch, seen = [], set()
    for task_id, members in groups.items():
        value = answer_of(tasks[task_id.split("@")[0]])
        if len(members) == run_cfg.algorithm.group_size and value not in seen:
            seen.add(value)
            batch.append(members)
    if len(batch) < len(VALUES):
        raise SystemExit(f"{args.run}: no whole version-0 group for every value in its shards ({sorted(seen)})")
    print("batch:", [(g[0].task_id, sum(float(t.reward) for t in g)) for g in batch])
    samples = []
    for members in batch:
        adv = group_advantages([float(t.reward) for t in members], run_cfg.algorithm.advantage_norm)
        samples += [Sample(f"{t.task_id}/{t.sample_index}", t.token_ids.astype(np.int32), t.loss_mask.astype(np.int8),
                           t.logprobs.astype(np.float32), a, temperature=temperature)
                    for t, a in zip(members, adv, strict=True)]

    template = ChatTemplate.from_model_dir(model_dir)
    prompts = list(tasks.values())
    prefixes = [value_prefix(template, t, system=SYSTEM_PROMPTS[run_cfg.rollout.system_prompt]) for t in prompts]
    choices = prefixes[0][1]

    answers = [VALUES.index(answer_of(t)) for t in prompts]

    def rows(model: torch.nn.Module) -> str:
        probs = choice_probabilities(model, [ids for ids, _ in prefixes], choices, temperature)
        return format_rows(rows_by_answer(probs, answers))

    cfg = load_config(args.run / "run.yaml", [f"trainer.lr={args.lr}",
                                              f"trainer.micro_batch_tokens={args.micro_batch_tokens}"])
    init_distributed(resolve({}))
    model = load_model(model_dir, cfg.trainer.precision, False)
    plain = copy.deepcopy(model)
    print("before         ", rows(model))
    engine = Engine(model, cfg.trainer, cfg.algorithm,
                    ref_model=copy.deepcopy(model) if cfg.algorithm.kl_coef > 0 else None)
    result = engine.train_step(plan_step(samples, 1, cfg.trainer.micro_batch_tokens).per_rank[0])
    print("trainer step   ", rows(engine.module), f"grad norm {result.grad_norm:.4f}")

    opt = torch.optim.AdamW(plain.parameters(), lr=args.lr, weight_decay=0.0, eps=args.eps)
    n_tokens = sum(int(s.loss_mask.sum()) for s in samples)
    for s in samples:  # the forward KL is 0 at the reference itself, so the first step is the policy gradient
        ids = torch.from_numpy(s.token_ids.astype(np.int64))[None]
        keep = torch.from_numpy(s.loss_mask[1:] == 1)
        logp = torch.log_softmax(plain(input_ids=ids).logits[0, :-1] / temperature, -1)
        (-(s.advantage * logp.gather(1, ids[0, 1:, None])[:, 0][keep].sum()) / n_tokens).backward()
    norm = torch.nn.utils.clip_grad_norm_(plain.parameters(), cfg.trainer.grad_clip)
    opt.step()
    print(f"AdamW eps {args.eps:g}", rows(plain), f"grad norm {float(norm):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
