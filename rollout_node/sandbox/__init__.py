"""Rootless sandboxes for agent episodes and the agent's tools (bash, python, files, submit).

Public surface: :func:`open_sandbox`, :class:`Sandbox`, :class:`ToolResult`, :func:`default_image`.
Isolation per runtime is spelled out in :mod:`rollout_node.sandbox.runtimes`.
"""

from rollout_node.sandbox.images import bwrap_unavailable_reason, default_image
from rollout_node.sandbox.result import ToolResult
from rollout_node.sandbox.sandbox import Sandbox, open_sandbox

__all__ = ["bwrap_unavailable_reason", "Sandbox", "ToolResult", "default_image", "open_sandbox"]
