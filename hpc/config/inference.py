"""Inference settings: engine, servers per node, sampling and the client's retry budget."""

from __future__ import annotations

from typing import Literal

from hpc.config.base import knob, section

# The CPU engine's defaults, here once: the knobs below, `spoolrl serve`'s flags and the engine's own
# signatures (train_node/infer/) all read these.
CPU_MAX_BATCH = 32
CPU_PREFIX_CACHE_MB = 0


@section
class InferenceConfig:
    """LLM servers (vLLM on GPUs, the lightweight CPU engine elsewhere) and how clients use them."""

    engine: Literal["cpu", "vllm"] = knob("cpu", doc="'cpu': transformers engine (spoolrl serve); 'vllm': vLLM")
    tensor_parallel: int = knob(1, doc="GPUs per vLLM server; servers per node = GPUs / tensor_parallel", min=1)
    port_base: int = knob(0, doc="first TCP port of a node's servers, server i uses port_base + i (0 = any free "
                          "port; the endpoint file says which)", min=0, max=65000, resumable=True)
    interface: str = knob("", doc="network interface whose address is advertised ('' = hostname)", resumable=True)
    vllm_python: str = knob("python3", doc="interpreter of the environment that has vllm installed", resumable=True)
    vllm_args: list[str] = knob(factory=list, doc="extra arguments for the vLLM server", resumable=True)
    temperature: float = knob(1.0, doc="sampling temperature (> 0: the trainer scores log_softmax(logits / T), the "
                              "distribution the tokens were drawn from)", min=0.0)
    top_p: float = knob(1.0, doc="nucleus sampling mass (must stay 1.0 while training: the trainer cannot reproduce "
                        "a nucleus)", min=0.0, max=1.0)
    request_timeout_s: float = knob(120.0, doc="timeout of one completion request", min=0.1, resumable=True)
    max_retries: int = knob(3, doc="retries (with backoff, failover to another server) per request", min=0,
                            resumable=True)
    outage_wait_s: float = knob(
        600.0, doc="when no inference server answers after max_retries (the only server restarting, the inference "
        "group requeued), a request keeps retrying (backoff up to 10 s) this long before the episode ends as "
        "inference_error; the wait is not counted in the episode's RUN clock, and these failures do not count "
        "toward rollout.max_consecutive_infra_faults until it is over (0 = max_retries only)", min=0.0,
        resumable=True)
    max_concurrent_per_server: int = knob(16, doc="in-flight requests per server from one client", min=1,
                                          resumable=True)
    num_cpu_servers: int = knob(1, doc="engine 'cpu': CPU engine servers per inference node", min=1, max=64,
                                resumable=True)
    cpu_threads: int = knob(0, doc="engine 'cpu': torch threads per server (0 = the node's CPUs / num_cpu_servers)",
                            min=0, resumable=True)
    cpu_max_batch: int = knob(CPU_MAX_BATCH, doc="engine 'cpu': most sequences decoded together in one forward pass",
                              min=1, resumable=True)
    cpu_prefix_cache_mb: int = knob(CPU_PREFIX_CACHE_MB, doc="engine 'cpu': MiB of KV kept from finished requests, so "
                                    "a prompt that starts with the same tokens (an agent's next turn, a group's shared "
                                    "prompt) forwards only the rest; emptied at every weight reload (0 = off, the "
                                    "default: the demo's tiny model gains 1.05x; 1024 took 4-turn SmolLM2 "
                                    "conversations 1.48x faster, and bench_learning_real runs with it; the demo's "
                                    "learning test ended 0.68-0.86 in four runs with it, 0.78-0.84 in five without: "
                                    "docs/inference.md)",
                                    min=0, resumable=True)
    dtype: Literal["auto", "float32", "bfloat16"] = knob(
        "auto", doc="weights dtype ('auto': float32 on the CPU engine, vLLM's own 'auto' on vLLM, which serves "
        "fp32 checkpoints in 16 bits; logprobs then differ from an fp32 forward pass by ~0.03)")
    max_model_len: int = knob(0, doc="context limit in tokens (0 = the model's max_position_embeddings)", min=0)
    require_auth_all: bool = knob(True, doc="require the run secret (Authorization: Bearer, RUN/control/secret) on "
                                  "every route but /health; false opens /v1/completions, /v1/models and "
                                  "/weight_info to anyone who reaches the port (weight changes always need it)",
                                  resumable=True)
    heartbeat_s: float = knob(2.0, doc="seconds between health checks + heartbeat updates of endpoint files",
                              min=0.1, resumable=True)
    policy_poll_s: float = knob(1.0, doc="seconds between checks of RUN/policy/LATEST", min=0.1, resumable=True)
    server_start_timeout_s: float = knob(900.0, doc="a server not healthy this long after its start is restarted",
                                         min=1.0, resumable=True)
    max_restarts: int = knob(5, doc="restarts of one server in a row without becoming healthy before the node "
                             "gives up (exits non-zero)", min=0, resumable=True)
    vllm_cpu_kvcache_gb: int = knob(1, doc="vLLM on CPU (no GPUs): KV cache GiB (VLLM_CPU_KVCACHE_SPACE, whole GiB)",
                                    min=1, resumable=True)
