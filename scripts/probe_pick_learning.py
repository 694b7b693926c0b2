#!/usr/bin/env python3
"""How fast can the tiny model learn ``builtin-pick`` by policy gradient? (an in-process probe, not the loop)

The loop costs ~1.3 s per episode on 2 cores; this probe isolates the one token that decides the reward
(the value written by the canonical ``str_replace``) and runs GRPO on it in-process (same warm start,
same prompts, same sampling temperature, group-normalised advantages, Adam), or on whole episodes
(``--episodes``), so a model/prompt/hyper-parameter choice can be judged in seconds before paying for
the whole loop. Nothing here is a learning claim: the claim must come from the demo
(tests/e2e/test_learning.py). What it found: ``docs/pick_learning.md``.

    scripts/probe_pick_learning.py [--lr 2e-4] [--group 16] [--steps 60] [--warm-steps 60] [--seed 0]
        [--tasks-per-step 4] [--random-tasks] [--kl 0.0] [--oracle] [--format-every N]
        [--episodes [--min-entropy NATS] [--ptx COEF]] [--pretrain-read STEPS [--pretrain-call]] [--base DIR]
        [--repeat N] [--rich] [--short-system] [--betas B1,B2] [--sgd] [--kl-full {off,reverse,forward}] [--balanced-warm] [--warmup STEPS]
        [--adv {group_std,group_mean}] [--head-lr SCALE] [--eps EPS]

Prints the exact expected reward (mean over the 16 instances of P(named value) at T) every 5 steps,
and every 10 steps the mean probability of each value given each requested value (one row per
requested value, in VALUES order): identical rows mean the policy ignores the statement.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollout_node.agent.prompts import BRIEF_SYSTEM_PROMPT as SHORT_SYSTEM  # rollout.system_prompt: brief

RICH = {
    "min": ("The smallest, lowest, least number: the minimum. Reports want the smallest of each list, the low "
            "point, the bottom, the least one, the minimum `min`. ",
            "Lowest wins. Take the least, the smallest, the minimum, the floor of the numbers, the low end `min`. ",
            "Minimum please: the smallest and lowest value, the least of them all, the bottom of the list `min`. ",
            "Report the low: smallest, lowest, least, minimum, the floor, never more than the bottom `min`. "),
    "max": ("The largest, highest, greatest number: the maximum. Reports want the largest of each list, the high "
            "point, the top, the greatest one, the maximum `max`. ",
            "Highest wins. Take the greatest, the largest, the maximum, the ceiling of the numbers, the high end `max`. ",
            "Maximum please: the largest and highest value, the greatest of them all, the top of the list `max`. ",
            "Report the high: largest, highest, greatest, maximum, the peak, never less than the top `max`. "),
    "first": ("The earliest, initial, leading number: the first. Reports want the opening item of each list, the "
              "head, the front, the beginning, the first `first`. ",
              "Earliest wins. Take the initial, the leading, the opening entry, the head of the numbers, the front `first`. ",
              "First please: the earliest and initial value, the one at the beginning, the head of the list `first`. ",
              "Report the start: earliest, initial, leading, opening, the head, the very beginning `first`. "),
    "last": ("The latest, final, trailing number: the last. Reports want the closing item of each list, the tail, "
             "the end, the most recent one, the last `last`. ",
             "Latest wins. Take the final, the trailing, the closing entry, the tail of the numbers, the end `last`. ",
             "Last please: the latest and final value, the one at the end, the tail of the list `last`. ",
             "Report the end: latest, final, trailing, closing, the tail, the very end `last`. "),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", metavar="DIR", help="warm-start this HF model directory instead of a tiny model build "
                    "(its tokenizer must encode each value as one token)")
    ap.add_argument("--pretrain-read", type=int, default=0, metavar="STEPS",
                    help="first pretrain the base to read (cached): cross-entropy on the value of 'Set `KEY` in "
                    "FILE to `VALUE`.' first turns for other keys, files and single-token words, min/max/first/"
                    "last left out (200 steps: ~130 s)")
    ap.add_argument("--pretrain-call", action="store_true",
                    help="with --pretrain-read: train the whole first turn (path, old, value, closing), not the value alone")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--group", type=int, default=16, help="samples per task (GRPO group)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warm-steps", type=int, default=60)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks-per-step", type=int, default=4,
                    help="groups per step; by default one task per value in turn (no value favoured)")
    ap.add_argument("--random-tasks", action="store_true",
                    help="draw each step's tasks at random, as the trainer's shuffled feeder does")
    ap.add_argument("--kl", type=float, default=0.0,
                    help="weight of a k3 KL penalty against the warm start (kl_coef): on the sampled values, or "
                    "with --episodes on every sampled policy token")
    ap.add_argument("--kl-full", choices=("off", "reverse", "forward"), default="off",
                    help="with --episodes and --kl: the exact KL over the whole vocabulary at every policy position "
                    "instead of k3 on the sampled token: 'reverse' KL(policy || warm start), whose pull on a value "
                    "the policy gave up vanishes with its probability, or 'forward' KL(warm start || policy), "
                    "which pulls it back (mass-covering)")
    ap.add_argument("--balanced-warm", action="store_true",
                    help="warm-start on statements each written with every value, a batch taking whole sets "
                    "(transcripts(balanced=True), WarmSpec.group=K): the values start exactly uniform")
    ap.add_argument("--format-every", type=int, default=0, metavar="N",
                    help="every N steps, sample 24 whole episodes through the agent loop (spoolrl warm-start's "
                    "measure) and print their well-formed share: this probe trains the value token alone, so "
                    "nothing here holds the rest of the format")
    ap.add_argument("--episodes", action="store_true",
                    help="train whole episodes as the trainer does: sample them through the agent loop from the "
                    "current model, reward 1 for a well-formed edit of the named value, and GRPO on every policy "
                    "token (token mean); prints the batch's reward and well-formed share every step")
    ap.add_argument("--min-entropy", type=float, default=0.0, metavar="NATS",
                    help="with --episodes: the policy-gradient term only on tokens whose entropy at T is at least "
                    "this (the 'forking tokens' of Wang et al. 2025; no trainer knob yet); the KL term stays on every token")
    ap.add_argument("--ptx", type=float, default=0.0, metavar="COEF",
                    help="with --episodes: add COEF x the warm start's cross-entropy on 16 of its transcripts per step, "
                    "the value token left out (format only; InstructGPT's PPO-ptx with the warm-start data)")
    ap.add_argument("--oracle", action="store_true",
                    help="supervised instead of RL: cross-entropy on the named value for every sample (the most "
                    "a step's samples could teach; a lower bound on the steps RL needs)")
    ap.add_argument("--repeat", type=int, default=0, metavar="N",
                    help="append 'It must be `VALUE`.' N more times to every statement (the warm start's transcripts "
                    "too): more of the prompt names the value (the packaged statements already insist 8 times)")
    ap.add_argument("--rich", action="store_true",
                    help="statements written in the value's own words throughout (RICH), not a shared skeleton "
                    "naming the value 2-3 times: most of the statement's tokens then depend on the value")
    ap.add_argument("--short-system", action="store_true",
                    help=f"the one-line system prompt {SHORT_SYSTEM!r} instead of the agent's (397 -> ~110 prompt "
                    "tokens), in the warm start's transcripts too")
    ap.add_argument("--eps", type=float, default=1e-8, metavar="EPS",
                    help="AdamW eps of the RL (or --oracle) steps (the trainer keeps torch's 1e-8): a larger eps damps the "
                    "sign-like first steps on parameters whose gradient is small")
    ap.add_argument("--betas", default="0.9,0.999", metavar="B1,B2",
                    help="AdamW betas of the RL (or --oracle) steps; --pretrain-read keeps its own optimizer")
    ap.add_argument("--warmup", type=int, default=0, metavar="STEPS",
                    help="raise the lr linearly over the first STEPS RL steps (trainer.warmup_steps: step s at "
                    "lr * min(1, s / STEPS))")
    ap.add_argument("--head-lr", type=float, default=1.0, metavar="SCALE",
                    help="lr multiplier of the input embeddings and lm_head (0: frozen): where a step's common-mode "
                    "swing of the value logits is cheapest")
    ap.add_argument("--adv", choices=("group_std", "group_mean"), default="group_std",
                    help="advantage normalisation, as algorithm.advantage_norm (group_mean: Dr. GRPO, no std)")
    ap.add_argument("--sgd", action="store_true",
                    help="SGD with momentum 0.9 instead of AdamW for the RL (or --oracle) steps (--lr is its step "
                    "size); --pretrain-read keeps its own optimizer")
    args = ap.parse_args()
    if (args.min_entropy or args.ptx) and not args.episodes:
        ap.error("--min-entropy and --ptx shape the --episodes objective: add --episodes")
    if args.pretrain_call and not args.pretrain_read:
        ap.error("--pretrain-call chooses what --pretrain-read trains: add --pretrain-read STEPS")
    try:
        betas = tuple(float(b) for b in args.betas.split(","))
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError
    except ValueError:
        ap.error(f"--betas {args.betas!r}: give two numbers in [0, 1) separated by a comma, e.g. 0.9,0.999")
    if args.format_every and (args.short_system or args.repeat or args.rich or args.balanced_warm):
        ap.error("--format-every samples episodes of the packaged statements with the agent's system prompt "
                 "(spoolrl warm-start's measure): drop --short-system / --repeat / --rich / --balanced-warm, or use --episodes")
    if args.kl_full != "off" and not (args.episodes and args.kl):
        ap.error("--kl-full changes how --episodes computes the --kl term: add --episodes and --kl COEF")
    if args.episodes and (args.oracle or args.format_every):
        ap.error("--episodes trains whole episodes and prints their well-formed share every step: "
                 "drop --oracle / --format-every")

    import dataclasses

    import torch

    from rollout_node.agent.prompts import SYSTEM_PROMPT
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.tasks import load_tasks
    from rollout_node.tasks.builtin.pick import CLOSING, VALUES, answer_of
    from rollout_node.tasks.builtin.warm import transcripts, value_prefix
    from train_node.infer.tiny import cached_tiny_model
    from train_node.infer.warm import WarmSpec, cached_warm_start, choice_probabilities, format_rows, rows_by_answer

    torch.manual_seed(args.seed)
    base = args.base or cached_tiny_model(seed=args.seed)
    if args.pretrain_read:
        base = pretrain_to_read(Path(base), args.pretrain_read, args.seed, args.pretrain_call)
    template = ChatTemplate.from_model_dir(base)
    tasks = load_tasks("builtin-pick")
    if args.rich:
        seen: dict[str, int] = {}
        rich = []
        for t in tasks:
            v = answer_of(t)
            j = seen[v] = seen.get(v, -1) + 1
            rich.append(dataclasses.replace(t, problem_statement=RICH[v][j % len(RICH[v])]
                                            + CLOSING.format(v=v) + "\n"))
        tasks = rich
    if args.repeat:
        tasks = [dataclasses.replace(t, problem_statement=t.problem_statement.rstrip("\n")
                                     + f" It must be `{answer_of(t)}`." * args.repeat + "\n") for t in tasks]
    system = SHORT_SYSTEM if args.short_system else SYSTEM_PROMPT  # transcripts, value prefixes, episodes
    examples = [(t.token_ids, t.loss_mask)
                for t in transcripts(template, tasks, 256, seed=args.seed, balanced=args.balanced_warm,
                                       system=system)]
    warm = cached_warm_start(base, examples, WarmSpec(seed=args.seed, steps=args.warm_steps,
                                                      group=len(VALUES) if args.balanced_warm else 1))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(warm), dtype=torch.float32)
    prefixes = [value_prefix(template, t, system=system) for t in tasks]
    choices = prefixes[0][1]
    answers = [VALUES.index(answer_of(t)) for t in tasks]
    by_value = {v: [i for i, a in enumerate(answers) if a == v] for v in range(len(VALUES))}
    params = param_groups(model, args.lr, args.head_lr)
    opt = (torch.optim.SGD(params, lr=args.lr, momentum=0.9) if args.sgd else
           torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=betas, eps=args.eps))
    gen = torch.Generator().manual_seed(args.seed)
    t_inv = 1.0 / args.temperature
    ref_logps = None  # the warm start's logprobs at each fixed prefix: computed once, it does not train
    if args.kl:
        with torch.no_grad():
            ref_logps = [torch.log_softmax(model(input_ids=torch.tensor([p])).logits[0, -1] * t_inv, -1)
                         for p, _ in prefixes]

    def expected() -> tuple[float, str]:
        """(the expected reward, P(each value | each requested value) as rows)."""
        probs = choice_probabilities(model, [p for p, _ in prefixes], choices, args.temperature)
        table = rows_by_answer(probs, answers)
        return sum(table[a][a] * len(by_value[a]) for a in by_value) / len(answers), format_rows(table)

    reward, rows = expected()
    print(f"step 0: expected reward {reward:.3f}  {rows}", flush=True)
    t0 = time.perf_counter()
    if args.episodes:
        train_episodes(model, opt, template, tasks, args, expected, examples, set(choices), system)
        return
    for step in range(1, args.steps + 1):
        rng = random.Random(args.seed * 100_003 + step)
        if args.random_tasks:
            batch = [rng.randrange(len(tasks)) for _ in range(args.tasks_per_step)]
        else:  # one task per value in turn: no value is favoured
            batch = [rng.choice(by_value[v % len(VALUES)]) for v in range(args.tasks_per_step)]
        opt.zero_grad()
        loss = torch.zeros(())
        for i in batch:
            logp = torch.log_softmax(model(input_ids=torch.tensor([prefixes[i][0]])).logits[0, -1] * t_inv, -1)
            if args.oracle:
                loss = loss - args.group * logp[choices[answers[i]]]
                continue
            picks = torch.multinomial(logp.exp().detach(), args.group, replacement=True, generator=gen)
            rewards = (picks == choices[answers[i]]).float()
            adv = advantages(rewards, args.adv)
            loss = loss - (adv * logp[picks]).sum()
            if ref_logps is not None:
                d = ref_logps[i][picks] - logp[picks]
                loss = loss + args.kl * (d.exp() - d - 1).sum()
        (loss / (len(batch) * args.group)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        warm_lr(opt, args, step)
        opt.step()
        if args.format_every and step % args.format_every == 0:
            print(f"step {step}: well-formed share {well_formed(model, warm, args.temperature):.2f}", flush=True)
        if step % 5 == 0:
            reward, rows = expected()
            print(f"step {step}: expected reward {reward:.3f}  ({time.perf_counter() - t0:.0f} s, "
                  f"{step * len(batch) * args.group} samples)  {rows if step % 10 == 0 else ''}", flush=True)


def train_episodes(model: Any, opt: Any, template: Any, tasks: list[Any], args: argparse.Namespace,
                   expected: Callable[[], tuple[float, str]], examples: list[Any], value_ids: set[int],
                   system: str) -> None:
    """GRPO on whole sampled episodes, every policy token trained (the trainer's token-mean objective)."""
    import copy

    import torch

    from hpc.cli.demo_model import _LocalPolicy
    from rollout_node.agent.loop import AgentLoop
    from rollout_node.agent.prompts import task_messages
    from rollout_node.tasks.builtin.pick import VALUES, answer_of
    from rollout_node.tasks.builtin.warm import RepoFileTools, limits
    from train_node.infer.warm import Sampler

    ref = copy.deepcopy(model).eval() if args.kl else None  # the warm start, frozen (algorithm.kl_coef's reference)
    sampler = Sampler.__new__(Sampler)
    sampler.model, sampler.gen = model, torch.Generator().manual_seed(args.seed)
    loop, tools = AgentLoop(template, limits(temperature=args.temperature)), RepoFileTools()
    by_value = {v: [t for t in tasks if answer_of(t) == v] for v in VALUES}

    def sampled_logps(net: Any, ids: Any, keep: Any) -> tuple[Any, Any]:
        """(log softmax(logits / T) at every position, the next tokens' logprobs where ``keep``)."""
        logp = torch.log_softmax(net(input_ids=ids).logits[0, :-1] / args.temperature, -1)
        return logp, logp.gather(1, ids[0, 1:, None])[:, 0][keep]

    ptx = []  # the warm start's transcripts as (ids, policy tokens but the value), built once
    for ids_, mask_ in examples if args.ptx else ():
        m = list(mask_)
        m[next(i for i, (t, k) in enumerate(zip(ids_, m, strict=True)) if k and t in value_ids)] = 0
        ptx.append((torch.tensor([list(ids_)]), torch.tensor(m[1:], dtype=torch.bool)))
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        rng = random.Random(args.seed * 100_003 + step)
        batch = ([rng.choice(tasks) for _ in range(args.tasks_per_step)] if args.random_tasks
                 else [rng.choice(by_value[VALUES[v % len(VALUES)]]) for v in range(args.tasks_per_step)])
        model.eval()
        episodes, formed, paid = [], 0, 0.0
        for task in batch:
            group = []
            for _ in range(args.group):
                tools.reset()
                result = loop.run(task_messages(task.problem_statement, system=system), _LocalPolicy(sampler),
                                  tools)
                ok = result.submitted and tools.written in VALUES and len(result.turns) == 2
                formed += ok
                group.append((result, float(ok and tools.written == answer_of(task))))
            rewards = torch.tensor([r for _, r in group])
            paid += float(rewards.sum())
            adv = advantages(rewards, args.adv)
            episodes += [(res, float(a)) for (res, _), a in zip(group, adv.tolist(), strict=True)]
        model.train()
        opt.zero_grad()
        n_tokens = sum(sum(res.loss_mask) for res, _ in episodes)
        for res, a in episodes:
            if a == 0.0 and ref is None:
                continue
            ids = torch.tensor([list(res.token_ids)])
            keep = torch.tensor(list(res.loss_mask[1:]), dtype=torch.bool)
            logp, picked = sampled_logps(model, ids, keep)
            if args.min_entropy:  # the policy gradient on forking tokens only
                forking = -(logp.detach().exp() * logp.detach()).sum(-1)[keep] >= args.min_entropy
                picked_pg = picked * forking
            else:
                picked_pg = picked
            loss = -(a * picked_pg.sum())
            if ref is not None and args.kl_full != "off":  # exact KL over the vocabulary
                with torch.no_grad():
                    ref_logp = sampled_logps(ref, ids, keep)[0][keep]
                mine = logp[keep]
                if args.kl_full == "reverse":  # KL(policy || warm start): no pull on what the policy abandoned
                    loss = loss + args.kl * (mine.exp() * (mine - ref_logp)).sum()
                else:  # KL(warm start || policy): pulls mass back onto every token the warm start gives any
                    loss = loss + args.kl * (ref_logp.exp() * (ref_logp - mine)).sum()
            elif ref is not None:  # k3 against the warm start on every sampled policy token, as the trainer's
                with torch.no_grad():
                    ref_picked = sampled_logps(ref, ids, keep)[1]
                d = ref_picked - picked
                loss = loss + args.kl * (d.exp() - d - 1).sum()
            (loss / n_tokens).backward()
        if args.ptx:  # format only: every policy token of warm-start transcripts but the value
            ptx_rng = random.Random(step)
            for ids, keep in (ptx[ptx_rng.randrange(len(ptx))] for _ in range(16)):
                (args.ptx * -sampled_logps(model, ids, keep)[1].mean() / 16).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        warm_lr(opt, args, step)
        opt.step()
        n = len(episodes)
        line = (f"step {step}: batch reward {paid / n:.2f} well-formed "
                f"{formed / n:.2f}  ({time.perf_counter() - t0:.0f} s)")
        if step % 5 == 0:
            reward, rows = expected()
            line += f"  expected reward {reward:.3f}  {rows if step % 10 == 0 else ''}"
        print(line, flush=True)


def param_groups(model: Any, lr: float, head_lr: float) -> list[dict[str, Any]]:
    """The optimizer's groups: the embeddings and lm_head at ``head_lr`` x the lr (0: frozen, exactly as the
    trainer's ``trainer.freeze_embeddings``), the rest at the lr."""
    from train_node.trainer.engine import freeze_embeddings

    if head_lr == 0.0:
        freeze_embeddings(model)
        return [{"params": [p for p in model.parameters() if p.requires_grad], "lr": lr, "lr_scale": 1.0}]
    head = {id(p) for layer in (model.get_input_embeddings(), model.get_output_embeddings()) for p in layer.parameters()}
    rest = [p for p in model.parameters() if id(p) not in head]
    heads = [p for p in model.parameters() if id(p) in head]
    return [{"params": rest, "lr": lr, "lr_scale": 1.0}, {"params": heads, "lr": lr * head_lr, "lr_scale": head_lr}]


def advantages(rewards: Any, norm: str) -> Any:
    """A group's advantages as the trainer makes them (``algorithm.advantage_norm``)."""
    import torch

    from train_node.trainer.loss import group_advantages

    return torch.tensor(group_advantages(rewards.tolist(), norm))


def warm_lr(opt: Any, args: argparse.Namespace, step: int) -> None:
    """Set step ``step``'s (1-based) lr as the trainer's ``warmup_steps`` schedule does."""
    if args.warmup:
        for g in opt.param_groups:
            g["lr"] = args.lr * g.get("lr_scale", 1.0) * min(1.0, step / args.warmup)


OPENINGS = ("{f} has the wrong {lk}\n\nThe `{k}` setting is still unset; it should be `{v}`. ",
            "We need `{v}` for {lk}\n\nOur jobs read `{k}` and expect `{v}` there. ",
            "Use `{v}`\n\nPlease make the {lk} option `{v}`. ",
            "{lk} is not configured\n\nStarting fails with `unknown {lk} 'unset'`. The team agreed on `{v}`. ")


def pretrain_to_read(base: Path, steps: int, seed: int, whole_call: bool = False) -> Path:
    """``base`` after ``steps`` of reading other settings' values (cached under $SPOOLRL_CACHE/probe-bases)."""
    import re
    import shutil

    import torch
    from transformers import AutoTokenizer

    from rollout_node.agent.prompts import task_messages
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.agent.toolcall import format_tool_call
    from rollout_node.tasks.builtin.pick import VALUES
    from train_node.infer.tiny import cache_root
    from train_node.infer.warm import TOKENIZER_FILES, _load

    out = cache_root() / "probe-bases" / f"read{steps}{'call' if whole_call else ''}-{base.name}-s{seed}"
    if (out / "config.json").is_file():
        return out
    tok, template = AutoTokenizer.from_pretrained(base), ChatTemplate.from_model_dir(base)

    def one_token(w: str) -> bool:
        return (len(tok.encode(f'"new": "{w}"}}')) == len(tok.encode('"new": "x"}'))
                and len(tok.encode(f"the `{w}` of")) == len(tok.encode("the `x` of")))

    words = [w for w in sorted(tok.get_vocab()) if re.fullmatch(r"[a-z]{3,9}", w) and w not in VALUES
             and one_token(w)]
    keys = [w.upper() for w in words if 4 <= len(w) <= 7][:300]
    files = [f"{a}/{b}.py" for a in ("app", "core", "service", "lib", "tools", "report")
             for b in ("config", "settings", "options", "defaults")]
    rng = random.Random(seed)
    items = []
    for _ in range(2048):
        k, v, f = rng.choice(keys), rng.choice(words), rng.choice(files)
        statement = rng.choice(OPENINGS).format(f=f, k=k, lk=k.lower(), v=v) + f"Set `{k}` in {f} to `{v}`.\n"
        call = format_tool_call("str_replace", {"path": f, "old": "unset", "new": v})
        prompt = template.first_prompt(task_messages(statement))
        if whole_call:  # the whole first turn (path, old, value, closing) after the prompt
            turn = [*template.encode_content(call), template.im_end]
            items.append((prompt + turn, len(prompt)))
        else:
            prefix = prompt + template.encode_content(call[: call.rindex(v)])
            items.append((prefix + [tok.encode(v)[0]], len(prefix)))
    torch.manual_seed(seed)
    model = _load(base).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    t0 = time.perf_counter()
    for step in range(steps):
        batch = [items[rng.randrange(len(items))] for _ in range(16)]
        width = max(len(p) for p, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        attn = torch.zeros(len(batch), width, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        for row, (p, start) in enumerate(batch):
            ids[row, : len(p)], attn[row, : len(p)] = torch.tensor(p), 1
            labels[row, start - 1: len(p) - 1] = torch.tensor(p[start:])
        hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state
        labelled = labels != -100
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[labelled]), labels[labelled])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in opt.param_groups:
            group["lr"] = 1e-3 * min(1.0, (step + 1) / 10)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"pretrain {step}: loss {float(loss):.2f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.eval().save_pretrained(tmp, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copy2(base / name, tmp / name)
    tmp.rename(out)
    return out


def well_formed(model: object, warm: object, temperature: float) -> float:
    """The share of well-formed episodes of ``model`` now (saved aside with the warm start's tokenizer)."""
    import shutil
    import tempfile

    from hpc.cli.demo_model import measure
    from train_node.infer.warm import TOKENIZER_FILES

    with tempfile.TemporaryDirectory(prefix="spoolrl-probe-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)  # type: ignore[attr-defined]
        for name in TOKENIZER_FILES:
            if (Path(str(warm)) / name).is_file():
                shutil.copy2(Path(str(warm)) / name, Path(tmp) / name)
        return float(measure(Path(tmp), episodes=24, temperature=temperature)["well_formed_share"])


if __name__ == "__main__":
    main()
