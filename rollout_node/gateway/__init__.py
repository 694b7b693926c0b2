"""The harness gateway: a session-scoped OpenAI-compatible endpoint per episode (chat completions and
the Responses API), token-exact traces.

One :class:`Gateway` per rollout node (and per ``rollout-server``) serves on a Unix socket on
node-local scratch; each episode opens a :class:`GatewaySession` whose ``key`` is the harness's
``OPENAI_API_KEY`` and whose ``socket_path`` the sandbox relays ``http://127.0.0.1:PORT/v1`` to.
``GatewaySession.close()`` returns the :class:`SessionTrace`: the token-exact segments (each a
:class:`rollout_node.pipeline.policy.Transcript`), calls, tokens prefilled again, LLM and gateway
seconds, and the infrastructure error if any. Use::

    gw = Gateway(scratch / "gateway.sock").start()
    s = gw.open_session(episode_key, client.session(episode_key), template, GatewaySampling.from_limits(limits, seed))
    ...  # run the harness with OPENAI_API_KEY=s.key, its loopback relayed to s.socket_path
    trace = s.close()
    gw.close()
"""

from rollout_node.gateway.render import Renderer, RenderError, ToolCallOut, split_tool_calls
from rollout_node.gateway.responses import ResponsesAnswer, ResponsesRequest, parse_responses
from rollout_node.gateway.server import Gateway
from rollout_node.gateway.session import GatewaySampling, GatewaySession, SessionClosed, SessionTrace
from rollout_node.gateway.wire import ChatAnswer, ChatRequest, WireError, parse_request

__all__ = ["ChatAnswer", "ChatRequest", "Gateway", "GatewaySampling", "GatewaySession", "RenderError", "Renderer",
           "ResponsesAnswer", "ResponsesRequest", "SessionClosed", "SessionTrace", "ToolCallOut", "WireError",
           "parse_request", "parse_responses", "split_tool_calls"]
