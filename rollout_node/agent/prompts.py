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


def task_messages(problem_statement: str, *, system: str = SYSTEM_PROMPT) -> list[Message]:
    """[system, user] messages for one task; whitespace at the ends is stripped (see template.py)."""
    return [Message("system", system.strip()), Message("user", problem_statement.strip())]
