"""Inference settings: engine, servers per node, sampling and the client's retry budget."""

from __future__ import annotations

from typing import Literal

from hpc.config.base import knob, section


@section
class InferenceConfig:
    """LLM servers (vLLM on GPUs, the lightweight CPU engine elsewhere) and how clients use them."""

    engine: Literal["cpu", "vllm"] = knob("cpu", doc="'cpu': transformers engine (spoolrl serve); 'vllm': vLLM")
    tensor_parallel: int = knob(1, doc="GPUs per vLLM server; servers per node = GPUs / tensor_parallel", min=1)
    port_base: int = knob(0, doc="first port of a node's servers (0 = derived from the job id)", min=0, max=65000,
                          resumable=True)
    interface: str = knob("", doc="network interface whose address is advertised ('' = hostname)", resumable=True)
    vllm_python: str = knob("python3", doc="interpreter of the environment that has vllm installed", resumable=True)
    vllm_args: list[str] = knob(factory=list, doc="extra arguments for the vLLM server", resumable=True)
    temperature: float = knob(1.0, doc="sampling temperature", min=0.0)
    top_p: float = knob(1.0, doc="nucleus sampling mass", min=0.0, max=1.0)
    request_timeout_s: float = knob(120.0, doc="timeout of one completion request", min=0.1, resumable=True)
    max_retries: int = knob(3, doc="retries (with backoff, failover to another server) per request", min=0,
                            resumable=True)
    max_concurrent_per_server: int = knob(16, doc="in-flight requests per server from one client", min=1,
                                          resumable=True)
