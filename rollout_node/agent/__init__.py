"""The LLM agent of a rollout node: token-in/token-out multi-turn loop, tools, inference client.

Import map: :mod:`.template` (ChatML pieces as IDs), :mod:`.toolcall` (call format + parser),
:mod:`.tools` (tools over a sandbox), :mod:`.policy` (the ``generate`` boundary), :mod:`.loop`
(the episode), :mod:`.result` (what an episode returns), :mod:`.seeds` (sampling seeds), :mod:`.prompts` (opening messages),
:mod:`.client` / :mod:`.http` (the inference client). No torch, no transformers.
"""

from rollout_node.agent.loop import AgentLimits, AgentLoop
from rollout_node.agent.policy import Completion, Policy, SamplingParams
from rollout_node.agent.prompts import SYSTEM_PROMPT, SYSTEM_PROMPTS, task_messages
from rollout_node.agent.result import EpisodeResult, TurnRecord
from rollout_node.agent.seeds import EpisodeSeed, sampling_seed
from rollout_node.agent.template import ChatTemplate, Message
from rollout_node.agent.toolcall import TOOL_DOCS, ParseError, ToolCall, format_tool_call, parse_tool_call
from rollout_node.agent.tools import SandboxTools, ToolOutput, Tools

__all__ = [
    "SYSTEM_PROMPT", "SYSTEM_PROMPTS", "TOOL_DOCS", "AgentLimits", "AgentLoop", "ChatTemplate", "Completion",
    "EpisodeResult", "EpisodeSeed", "Message", "ParseError", "Policy", "SamplingParams", "SandboxTools", "ToolCall", "ToolOutput", "Tools",
    "TurnRecord", "format_tool_call", "parse_tool_call", "sampling_seed", "task_messages",
]
