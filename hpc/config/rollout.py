"""Rollout-node settings: the INIT -> RUN -> EVAL pipeline and the agent loop."""

from __future__ import annotations

import re
from typing import Literal

from hpc.config.base import knob, section

HARNESS_INSIDE = "/run/spoolrl/harness"  # where rollout.harness.prefix appears inside every sandbox
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# set by spoolrl for every harness episode (the gateway's address and key, the task file, the prefix's PATH)
HARNESS_RESERVED_ENV = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY", "SPOOLRL_TASK_FILE", "PATH")


@section
class HarnessConfig:
    """``rollout.policy: harness``: an unmodified agent harness, run in the episode's sandbox against the gateway."""

    command: str = knob(
        "", doc="shell command line (bash -c) that runs the harness inside the episode sandbox, in the task's "
        "working directory (/work); the problem statement is in $SPOOLRL_TASK_FILE and on stdin; "
        "OPENAI_BASE_URL / OPENAI_API_BASE / OPENAI_API_KEY point at this episode's gateway session",
    )
    env: dict[str, str] = knob(factory=dict, doc="extra environment of the harness (NAME: value)")
    prefix: str = knob(
        "", doc="absolute path of the harness install on the shared filesystem (made by 'spoolrl harness install'), "
        f"bind-mounted read-only at {HARNESS_INSIDE} in every sandbox; its bin/ is on the harness's PATH",
    )
    submit: Literal["diff"] = knob(
        "diff", doc="how the episode's result is taken: 'diff' = the working tree's diff against the base commit "
        "when the harness exits (what EVAL applies)",
    )

    def check(self) -> list[str]:
        problems = []
        if self.prefix and not self.prefix.startswith("/"):
            problems.append(f"prefix: {self.prefix!r} is not absolute; give the install's absolute path on the "
                            "shared filesystem (spoolrl harness install SPEC --prefix DIR)")
        if any(c in self.prefix for c in ",:"):
            problems.append(f"prefix: {self.prefix!r} contains ',' or ':', which apptainer's --bind reads as "
                            "separators; install the harness under a path without them")
        for name in self.env:
            if not _ENV_NAME.fullmatch(name):
                problems.append(f"env: {name!r} is not an environment variable name (letters, digits, _)")
            elif name in HARNESS_RESERVED_ENV:
                problems.append(f"env: {name} is set by spoolrl for every harness episode; remove it")
        return problems


@section
class RolloutConfig:
    """One rollout node: stage workers, queues, timeouts, retries and the agent's budget."""

    policy: Literal["llm", "scripted", "harness"] = knob(
        "llm", doc="'llm': the built-in agent talks to the inference servers; 'scripted': replay tool calls (tests, "
        "debugging); 'harness': an unmodified agent harness (rollout.harness) talks to a per-episode gateway"
    )
    harness: HarnessConfig = knob(factory=HarnessConfig, doc="the agent harness of policy: harness")
    init_workers: int = knob(0, doc="INIT workers (0 = from the node's CPUs and free scratch)", min=0, resumable=True)
    run_workers: int = knob(0, doc="concurrent agent episodes (0 = auto)", min=0, resumable=True)
    eval_workers: int = knob(0, doc="EVAL workers (0 = from the node's CPUs)", min=0, resumable=True)
    queue_size: int = knob(8, doc="bound of each queue between stages", min=1, resumable=True)
    init_timeout_s: float = knob(300.0, doc="time limit inside INIT (not counting queueing)", min=1.0)
    run_timeout_s: float = knob(1800.0, doc="time limit inside RUN (one episode), not counting time spent waiting "
                                "for the inference server (each request is bounded by inference.request_timeout_s)",
                                min=1.0)
    eval_timeout_s: float = knob(600.0, doc="time limit inside EVAL (the test run)", min=1.0)
    max_retries: int = knob(2, doc="retries of an episode after an infrastructure failure", min=0)
    eval_dedup: bool = knob(
        True, doc="EVAL each distinct diff of a group once: samples of the group that end with the same diff share "
        "its result (only within the group; false: every sample runs the tests, e.g. to draw a flaky suite anew)",
    )
    max_consecutive_infra_faults: int = knob(
        10, doc="a node whose episodes hit this many infrastructure faults in a row (no other outcome between) "
        "stops claiming, releases its tasks and exits non-zero (0 = never)", min=0, resumable=True,
    )
    system_prompt: Literal["full", "brief"] = knob(
        "full", doc="the agent's system prompt: 'full' (the role, the tool-call format and every tool's arguments) "
        "or 'brief' (one line; for a model that already learnt the format, as the demo's warm start)",
    )
    max_turns: int = knob(20, doc="agent turns per episode", min=1)
    max_tokens: int = knob(4096, doc="total token budget per episode (prompt + generations)", min=16)
    max_new_tokens_per_turn: int = knob(256, doc="tokens generated per turn", min=1)
    observation_max_tokens: int = knob(512, doc="tool output is truncated to this many tokens", min=8)
    scripted_plan: str = knob(
        "gold", doc="policy: scripted only: 'ACTION' or 'TASK_GLOB=A|B;...' (actions per attempt; see "
        "rollout_node.pipeline.scripted): gold, empty, tamper_test, tamper_conftest, tamper_pth, hang, slow, crash, "
        "inference_error",
    )
    drain_timeout_s: float = knob(
        20.0, doc="after SIGUSR1/STOP, in-flight groups may finish this long, then go back to the spool (after a "
        "SIGTERM at once: Slurm signalled their sandboxes first)", min=0.0, resumable=True,
    )
    time_limit_margin_s: float = knob(
        60.0, doc="stop claiming when the job's remaining time is below p95 group time + this margin", min=0.0,
        resumable=True,
    )
    claim_lookahead: int = knob(
        2, doc="tasks claimed ahead of INIT, so that tasks whose image is already cached on the node go first",
        min=1, resumable=True,
    )
    scratch_per_episode_gb: float = knob(
        1.0, doc="node-local disk one episode may use: caps the default worker counts by free space, and an "
        "episode whose work dir + sandbox scratch grow past it is ended by the watchdog (the agent's outcome: "
        "trainable, reward 0, not retried)",
        min=0.01, resumable=True,
    )
    metrics_interval_s: float = knob(10.0, doc="how often the node writes its metrics record", min=0.1,
                                     resumable=True)

    def check(self) -> list[str]:
        if self.policy != "harness":
            return []
        problems = []
        if not self.harness.command.strip():
            problems.append("harness.command: required with policy: harness; e.g. 'mini -y --exit-immediately "
                            "-m openai/policy -t \"$(cat $SPOOLRL_TASK_FILE)\"'")
        if not self.harness.prefix:
            problems.append("harness.prefix: required with policy: harness; install one with "
                            "'spoolrl harness install SPEC --prefix DIR' and give DIR")
        return problems
