"""The demo's policy before RL: the tiny model, warm-started on format-only ``builtin-pick`` episodes.

Part of the CLI face (with :mod:`hpc.cli.demo_run`): it joins the rollout side (the agent's pieces
build the transcripts) and the model side (``train_node.infer.warm`` fits and samples), which only the
face may do; both are imported inside the functions, so ``spoolrl --help`` loads neither.

Guarantees:
- :func:`warm_model` is cached (same seed and settings: the same directory, no refit) and takes
  about a minute on 2 cores on a miss.
- :func:`measure` reports, before any RL step, the share of well-formed episodes (an edit of the
  setting to one of the K values, then submit, through the real agent loop) and the reward: the
  sampled share of correct answers and the exact expectation from the value token's probabilities.
  The transcripts draw the value independently of the statement, so the expectation is about 1/K.
- :func:`lookup_warm_model`: a pretrained chat model (SmolLM2) fitted on the canonical episodes of
  ``builtin-lookup-warm`` (the set disjoint from ``builtin-lookup`` and its held-out set; a few SFT steps on
  the top blocks), cached like :func:`warm_model`; :func:`measure_lookup` samples episodes of a lookup set
  in this process (the sandbox's file tools on a copy of the repository) for a quick pass rate.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

TRANSCRIPTS = 256
DEMO_SYSTEM_PROMPT = "brief"  # the demo's rollout.system_prompt (hpc.cli.demo_run.DEMO_OVERRIDES)
LOOKUP_WARM_SET = "builtin-lookup-warm"


@dataclasses.dataclass(frozen=True)
class LookupWarm:
    """The lookup warm start: SFT steps on the top ``trainable_layers`` blocks, with the agent's budget."""

    steps: int = 16
    batch_size: int = 4
    lr: float = 1e-3  # measured: 1e-4 (16 steps) left the model answering in prose; 1e-3 taught the format
    trainable_layers: int = 4
    seed: int = 0
    system_prompt: str = "brief"
    max_turns: int = 4
    max_new_tokens_per_turn: int = 64
    observation_max_tokens: int = 128
    # > 0: that many demonstrations per warm instance, each showing and writing a value drawn at random, so no
    # value can be recalled (rollout_node.tasks.builtin.warm.lookup_transcripts); 0: each instance's own value,
    # which the fit learns by heart (loss 0.08 over 32 values) and then writes, from memory, on instances it never
    # saw (the runaway digits of the 2026-12-06 runs)
    drawn_values: int = 2

    def limits(self, temperature: float = 1.0) -> Any:
        from rollout_node.agent.loop import AgentLimits

        return AgentLimits(max_turns=self.max_turns, max_tokens=4096, temperature=temperature,
                           max_new_tokens_per_turn=self.max_new_tokens_per_turn,
                           observation_max_tokens=self.observation_max_tokens)


def warm_model(seed: int = 0, *, system_prompt: str = DEMO_SYSTEM_PROMPT, transcripts: int = TRANSCRIPTS,
               steps: int | None = None) -> Path:
    """The cached warm-started tiny model for ``run.seed`` = ``seed`` and ``rollout.system_prompt``.

    Value-balanced: each drawn statement is written once with every value and a batch takes whole
    sets, so before RL the values are exactly uniform for every statement (no value favoured, which
    RL would otherwise amplify into a collapse)."""
    from rollout_node.agent.prompts import SYSTEM_PROMPTS
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.tasks import load_tasks
    from rollout_node.tasks.builtin.pick import VALUES
    from rollout_node.tasks.builtin.warm import transcripts as build_transcripts
    from train_node.infer.tiny import cached_tiny_model
    from train_node.infer.warm import WarmSpec, cached_warm_start

    base = cached_tiny_model(seed=seed)
    template = ChatTemplate.from_model_dir(base)
    examples = [(t.token_ids, t.loss_mask) for t in
                build_transcripts(template, load_tasks("builtin-pick"), transcripts, seed=seed, balanced=True,
                                  system=SYSTEM_PROMPTS[system_prompt])]
    spec = WarmSpec(seed=seed, group=len(VALUES))
    return cached_warm_start(base, examples, spec if steps is None else dataclasses.replace(spec, steps=steps))


class _LocalPolicy:
    """The agent loop's Policy over an in-process sampler (measurement only; the demo uses the servers)."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    def generate(self, prompt_ids: Any, sampling: Any) -> Any:
        from rollout_node.agent.policy import Completion

        ids, logps = self.sampler.generate(prompt_ids, sampling.max_tokens, sampling.temperature,
                                           sampling.stop_token_ids)
        return Completion(token_ids=tuple(ids), logprobs=tuple(logps), versions=(0,) * len(ids))


def expected_reward(model_dir: Path, temperature: float, system_prompt: str = DEMO_SYSTEM_PROMPT) -> dict[str, Any]:
    """Exact: the mean over instances of P(the named value) at ``temperature``, and the mass on the K values."""
    from rollout_node.agent.prompts import SYSTEM_PROMPTS
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.tasks import load_tasks
    from rollout_node.tasks.builtin.pick import VALUES, answer_of
    from rollout_node.tasks.builtin.warm import value_prefix
    from train_node.infer.warm import rows_by_answer, value_probabilities

    template = ChatTemplate.from_model_dir(model_dir)
    tasks = load_tasks("builtin-pick")
    prefixes = [value_prefix(template, t, system=SYSTEM_PROMPTS[system_prompt]) for t in tasks]
    probs = value_probabilities(model_dir, [p for p, _ in prefixes], prefixes[0][1], temperature)
    answers = [VALUES.index(answer_of(t)) for t in tasks]
    correct = [row[a] for row, a in zip(probs, answers, strict=True)]
    # answer the statement names -> mean probability of each value: no diagonal before RL
    by_answer = {a: [round(x, 3) for x in row] for a, row in zip(VALUES, rows_by_answer(probs, answers), strict=True)}
    return {"expected_reward": sum(correct) / len(correct), "value_mass": sum(map(sum, probs)) / len(probs),
            "mean_probs_by_answer": by_answer, "values": list(VALUES)}


def measure(model_dir: Path, *, episodes: int = 64, temperature: float = 0.7, seed: int = 0,
            system_prompt: str = DEMO_SYSTEM_PROMPT) -> dict[str, Any]:
    """Sampled episodes through the real agent loop (tools: the sandbox's file tool on a copy of the repo)."""
    import random

    from rollout_node.agent.loop import AgentLoop
    from rollout_node.agent.prompts import SYSTEM_PROMPTS, task_messages
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.tasks import load_tasks
    from rollout_node.tasks.builtin.pick import VALUES, answer_of
    from rollout_node.tasks.builtin.warm import RepoFileTools, limits
    from train_node.infer.warm import Sampler

    template = ChatTemplate.from_model_dir(model_dir)
    loop = AgentLoop(template, limits(temperature=temperature))
    policy = _LocalPolicy(Sampler(model_dir, seed=seed))
    tasks, rng = load_tasks("builtin-pick"), random.Random(seed)
    well_formed = correct = 0
    with RepoFileTools() as tools:
        for _ in range(episodes):
            task = rng.choice(tasks)
            tools.reset()
            result = loop.run(task_messages(task.problem_statement, system=SYSTEM_PROMPTS[system_prompt]), policy,
                              tools)
            ok = result.submitted and tools.written in VALUES and len(result.turns) == 2
            well_formed += ok
            correct += ok and tools.written == answer_of(task)
    return {"episodes": episodes, "temperature": temperature, "well_formed_share": well_formed / episodes,
            "sampled_reward": correct / episodes, "system_prompt": system_prompt,
            **expected_reward(model_dir, temperature, system_prompt)}


def lookup_warm_model(base: Path, warm: LookupWarm = LookupWarm()) -> Path:
    """``base`` fitted on the canonical episodes of ``builtin-lookup-warm`` (cached; see the module's Guarantees)."""
    from rollout_node.agent.prompts import SYSTEM_PROMPTS
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.tasks import load_tasks
    from rollout_node.tasks.builtin.warm import lookup_transcripts
    from train_node.infer.warm import WarmSpec, cached_warm_start

    template = ChatTemplate.from_model_dir(base)
    examples = [(t.token_ids, t.loss_mask) for t in
                lookup_transcripts(template, load_tasks(LOOKUP_WARM_SET), agent_limits=warm.limits(),
                                   system=SYSTEM_PROMPTS[warm.system_prompt], drawn_values=warm.drawn_values,
                                   seed=warm.seed)]
    spec = WarmSpec(steps=warm.steps, batch_size=warm.batch_size, lr=warm.lr, seed=warm.seed,
                    trainable_layers=warm.trainable_layers)
    return cached_warm_start(base, examples, spec)


def measure_lookup(model_dir: Path, source: str, *, k: int = 1, temperature: float = 0.7, seed: int = 0,
                   warm: LookupWarm = LookupWarm()) -> dict[str, Any]:
    """Every instance of ``source`` sampled ``k`` times in this process: the share that wrote the file's value
    and submitted, and the share that made the family's edit at all (the format)."""
    from rollout_node.agent.loop import AgentLoop
    from rollout_node.agent.prompts import SYSTEM_PROMPTS, task_messages
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.tasks import load_tasks
    from rollout_node.tasks.builtin import lookup
    from rollout_node.tasks.builtin.warm import RepoFileTools
    from train_node.infer.warm import Sampler

    template = ChatTemplate.from_model_dir(model_dir)
    loop = AgentLoop(template, warm.limits(temperature))
    policy = _LocalPolicy(Sampler(model_dir, seed=seed))
    passed = edited = episodes = 0
    with RepoFileTools(lookup.REPO, (lookup.CONFIG,), lookup.written_value) as tools:
        for task in load_tasks(source):
            for _ in range(k):
                tools.reset()
                result = loop.run(task_messages(task.problem_statement, system=SYSTEM_PROMPTS[warm.system_prompt]),
                                  policy, tools)
                episodes += 1
                edited += tools.written is not None
                passed += bool(result.submitted) and tools.written == lookup.answer_of(task)
    return {"source": source, "episodes": episodes, "temperature": temperature, "pass_rate": passed / episodes,
            "edit_share": edited / episodes}
