"""Task source, model and run-level settings."""

from __future__ import annotations

from typing import Literal

from hpc.config.base import knob, section

# tasks.source names of the task sets shipped in rollout_node/tasks/builtin/ -> their file there.
BUILTIN_TASK_SETS = {
    "builtin": "tasks.jsonl",       # 16 real bug fixes in four small repositories
    "builtin-pick": "pick.jsonl",   # the learnable family: write the one of 4 values the statement names
    # the answer only in a tool observation: copy a setting's value from its file (rollout_node/tasks/builtin/lookup.py)
    "builtin-lookup": "lookup.jsonl",                   # 64 instances to train on
    "builtin-lookup-heldout": "lookup_heldout.jsonl",   # 32 others, only evaluated
    "builtin-lookup-warm": "lookup_warm.jsonl",         # 32 others, for a warm start
}


def builtin_task_file(source: str) -> str | None:
    """The file name (in rollout_node/tasks/builtin/) of a built-in ``tasks.source``, else None (a path)."""
    return BUILTIN_TASK_SETS.get(source)


@section
class TasksConfig:
    """Where tasks come from and in what order they are fed."""

    source: str = knob("builtin", doc="a SWE-bench-style JSONL file, or a built-in set: 'builtin' (16 bug fixes), "
                       "'builtin-pick' (learnable: write the value the statement names; the demo's), 'builtin-lookup' (64 instances: "
                       "copy a setting's value from its file, then submit; 'builtin-lookup-heldout' and "
                       "'builtin-lookup-warm' are two disjoint sets of 32 more)")
    repo_cache: str = knob("", doc="local mirror of task repositories ('' = RUN/repos for built-in tasks)",
                           resumable=True)
    epochs: int = knob(1, doc="passes over the task set", min=1, resumable=True)
    order: Literal["shuffle", "file"] = knob(
        "shuffle", doc="order of each epoch: 'shuffle' (seeded by shuffle_seed, a new order every epoch) or 'file' "
        "(the file's order every epoch: a curriculum, or batches the file balances; builtin-pick lists one "
        "instance of each value in turn, so with groups_per_step = trainer.max_tasks_outstanding = 4 each step "
        "holds every value once: the rollout node claims outstanding tasks in any order)")
    shuffle_seed: int = knob(0, doc="seed of the per-epoch shuffle (tasks.order: shuffle)")
    eval_python: str = knob(
        "python3", doc="python that runs pytest inside the EVAL sandbox (the image's; for runtime: local give "
        "a host python with pytest, e.g. .venv/bin/python)", resumable=True,
    )


@section
class ModelConfig:
    """The policy model and tokenizer (a local Hugging Face directory; nothing is downloaded)."""

    path: str = knob("tiny", doc="HF model directory, or 'tiny' to build a tiny random model into RUN/model")
    tokenizer_path: str = knob("", doc="tokenizer directory ('' = same as path)")


@section
class RunSection:
    """Run-level identity."""

    name: str = knob("spoolrl-run", doc="a name for humans (logs, job names)", resumable=True)
    seed: int = knob(0, doc="run seed: sampling seeds derive from it, the task id, sample index and attempt")
