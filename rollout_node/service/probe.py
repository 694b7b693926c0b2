"""Is an address that ``/add_llm_server`` was given an LLM backend the rollout nodes can use?

The probe is the nodes' own request: :class:`~rollout_node.agent.client.InferenceClient` (same
``GET /v1/models`` for the model name, same ``/v1/completions`` body with a token-ID prompt, same
bearer token, same answer check :func:`~rollout_node.agent.client.parse_completion`) for one token
of a one-token prompt, with no retries.

Guarantees:
- :attr:`Probe.refusal` is set only when the address answered and the answer proves the nodes
  cannot use it: a 4xx (e.g. NeMo Gym's model server, which serves ``/v1/responses`` and
  ``/v1/chat/completions`` only, answers 404 to ``/v1/models`` and ``/v1/completions``) or a 200
  without the token record (``token_ids``, ``logprobs.token_logprobs``, ``weight_versions``).
- An address that does not answer (refused connection, timeout, 5xx, unreadable body) is not refused:
  an engine may be registered before it is up, as with ProRL; :attr:`Probe.unverified` says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout_node.agent.client import InferenceClient, ProtocolError, RetryPolicy
from rollout_node.agent.http import FatalHTTPError, TransientHTTPError
from rollout_node.agent.policy import SamplingParams

PROBE_PROMPT = (0,)  # a valid ID in every vocabulary
NEEDED = ("vLLM's /v1/completions with a token-ID prompt, answering token_ids, logprobs.token_logprobs and "
          "weight_versions (vLLM >= 0.32 or `spoolrl serve`; docs/inference.md)")


@dataclass(frozen=True)
class Probe:
    """The outcome for one base URL: usable (both None), refused, or not answering yet."""

    refusal: str | None = None
    unverified: str | None = None


def probe_backend(url: str, *, token: str | None, timeout_s: float) -> Probe:
    """One token-ID completion against ``url`` (``http://host:port``, no ``/v1``); blocking."""
    client = InferenceClient([url], request_timeout_s=timeout_s, retry=RetryPolicy(max_retries=0, outage_wait_s=0.0),
                             token=token)
    try:
        client.complete(url, PROBE_PROMPT, SamplingParams(max_tokens=1))
    except FatalHTTPError as exc:
        return Probe(refusal=f"it rejected the nodes' request ({exc})")
    except ProtocolError as exc:
        return Probe(refusal=f"its /v1/completions answer is not token level ({exc})")
    except TransientHTTPError as exc:
        return Probe(unverified=str(exc))
    finally:
        client.close()
    return Probe()


def refusal_detail(address: str, refusal: str) -> str:
    """The 422 body of ``/add_llm_server``: what is missing and what to register instead."""
    return (f"address {address!r} is not an LLM server spoolrl's rollout nodes can use: {refusal}. They need "
            f"{NEEDED}. NeMo Gym's model server (responses_api_models/vllm_model) serves only /v1/responses and "
            "/v1/chat/completions: register the vLLM server behind it instead (its policy_base_url, e.g. "
            "http://vllm-host:8000/v1), or start rollout-server with service.llm_server=URL[,URL...]. "
            "Nothing was registered.")
