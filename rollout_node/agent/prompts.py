"""The opening messages of a coding episode: a system prompt with the tool format, then the task.

Guarantees: pure text (the loop turns it into IDs with the piece rule); deterministic for a task,
so every sample of a GRPO group shares the same prompt IDs (and a server's prefix cache).
"""

from __future__ import annotations

from rollout_node.agent.template import Message
from rollout_node.agent.toolcall import TOOL_DOCS

SYSTEM_PROMPT = (
    "You are a software engineer working in a repository checked out at /work. Find and fix the bug "
    "described by the user. Explore with the tools, make the smallest correct change, then submit.\n\n"
    + TOOL_DOCS
)
# ``rollout.system_prompt: brief``: one line, for a policy that already learnt the tool-call format (the
# demo's warm start). The task is then most of the prompt: on builtin-pick the tiny model reads the
# statement from RL only with it (docs/pick_learning.md).
BRIEF_SYSTEM_PROMPT = ("You are a software engineer. Fix the repository at /work with one tool call per turn, as JSON "
                       "inside <tool_call> tags, then submit.")
SYSTEM_PROMPTS = {"full": SYSTEM_PROMPT, "brief": BRIEF_SYSTEM_PROMPT}  # rollout.system_prompt -> text


def task_messages(problem_statement: str, *, system: str = SYSTEM_PROMPT) -> list[Message]:
    """[system, user] messages for one task; whitespace at the ends is stripped (see template.py)."""
    return [Message("system", system.strip()), Message("user", problem_statement.strip())]
