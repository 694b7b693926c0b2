"""Scripted episodes through the REAL agent loop: canned completions instead of an LLM.

:class:`~rollout_node.pipeline.scripted.ScriptedPolicy` uses this for its hostile actions (issue 13,
point 4): each is a list of assistant completions (tool-call text, well-formed or not) that
:class:`~rollout_node.agent.AgentLoop` decodes, parses and runs with
:class:`~rollout_node.agent.SandboxTools` on the episode's real sandbox, exactly as for a model;
after the last one the agent submits. The tokenizer is byte-level (one ID per byte, ChatML
special tokens added), built in code, so no model directory is needed.

Guarantees: the episode's record is the loop's own token lists (``logprob_kind`` "synthetic": the
trainer refuses it); ``metrics["observations"]`` holds the head of every observation (what the
agent was told), so tests can check each call became an observation and not an exception.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from rollout_node.agent import (
    AgentLimits,
    AgentLoop,
    ChatTemplate,
    Completion,
    SamplingParams,
    SandboxTools,
    format_tool_call,
    task_messages,
)
from rollout_node.pipeline.policy import EpisodeContext, EpisodeOutput, Transcript

SUBMIT = format_tool_call("submit", {})
OBSERVATION_HEAD = 4000
LOGPROB = -0.5


@functools.lru_cache(maxsize=1)
def byte_template() -> ChatTemplate:
    """A ChatML template over a byte-level vocabulary (256 byte IDs + 3 special tokens)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    return ChatTemplate(tok, eos_token="<|endoftext|>")


class CannedAgent:
    """The loop's policy: the next completion of the script (then ``submit``), as byte IDs + ``<|im_end|>``."""

    def __init__(self, template: ChatTemplate, script: Sequence[str], ctx: EpisodeContext) -> None:
        self.template, self.script, self.ctx, self.turn = template, list(script), ctx, 0

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
        text = self.script[self.turn] if self.turn < len(self.script) else SUBMIT
        self.turn += 1
        ids = [*self.template.encode_content(text)[: sampling.max_tokens - 1], self.template.im_end]
        version = self.ctx.policy_version()
        self.ctx.transcript.note_versions([version])
        return Completion(tuple(ids), (LOGPROB,) * len(ids), (version,) * len(ids), logprob_kind="synthetic")


def run_script(ctx: EpisodeContext, script: Sequence[str]) -> EpisodeOutput:
    """Run ``script`` (then submit) through the real agent loop on ``ctx.sandbox``."""
    template = byte_template()
    limits = AgentLimits(max_turns=len(script) + 2, max_tokens=1 << 22, max_new_tokens_per_turn=1 << 18,
                         observation_max_tokens=1 << 14, temperature=1.0)
    loop = AgentLoop(template, limits)
    tools = SandboxTools(ctx.sandbox, timeout_s=ctx.tool_timeout_s)
    result = loop.run(task_messages(ctx.task.problem_statement or ctx.task_id), CannedAgent(template, script, ctx),
                      tools, cancel=lambda _so_far: (ctx.stop_reason or "stopped") if ctx.stop_event.is_set() else None,
                      deadline=ctx.effective_deadline)
    ctx.transcript.replace(Transcript(token_ids=result.token_ids, loss_mask=result.loss_mask,
                                      logprobs=result.logprobs, policy_versions=result.policy_versions,
                                      prompt_len=result.prompt_len))
    observations = [(t.observation or "")[:OBSERVATION_HEAD] for t in result.turns]
    return EpisodeOutput(status=result.status, metrics={**result.metrics(), "observations": observations},
                         sampling=dict(result.sampling), logprob_kind="synthetic")


def bash(command: str) -> str:
    return format_tool_call("bash", {"command": command})


def python(code: str) -> str:
    return format_tool_call("python", {"code": code})


def raw_call(body: str) -> str:
    """A tool-call block around ``body`` as written (malformed JSON on purpose)."""
    return f"<tool_call>\n{body}\n</tool_call>"


def _bad_json() -> list[str]:
    deep = '{"name": "bash", "arguments": {"command": ' + "[" * 5000 + "]" * 5000 + "}}"
    return [raw_call(b) for b in (
        '{"name": "bash", "arguments": {"command": "ls", "timeout_s": NaN}}',
        '{"name": "bash", "arguments": {"command": "ls", "timeout_s": Infinity}}',
        '{"name": "bash", "arguments": {"command": "ls", "timeout_s": -Infinity}}',
        '{"name": "bash", "arguments": {"command": "ls", "timeout_s": ' + "9" * 400 + "}}",
        '{"name": "bash", "arguments": {"command": "ls", "timeout_s": 1e400}}',
        '{"name": "bash", "arguments": {"command": "ls", "timeout_s": -5}}',
        '{"name": "view", "arguments": {"path": "README.txt", "start_line": -99999999999}}',
        '{"name": "insert", "arguments": {"path": "README.txt", "line": ' + "1" * 40 + ', "text": "x"}}',
        deep,
        "[" * 20000,
        '{"name": "bash", "arguments": {"command": "ls"}',
        '"just a string"',
        '{"name": "bash", "arguments": ["ls"]}',
        '{"name": "rm_rf", "arguments": {}}',
    )] + ["<tool_call>\n{\"name\": \"bash\"", "no call at all"]


_NONCE = "n=$(printf %s \"$PROMPT_COMMAND\" | sed -n 's/.*\\\\036\\([0-9a-f]*\\):.*/\\1/p')"
_GARBAGE_HANDLE = ("import __main__\n__main__.handle = lambda *a: {'output': {'not': 'text'}, 'exit_code': 10**40, "
                   "'timed_out': 'yes', 'truncated': [1], 'total_bytes': 'many'}\n")
_DEEP_FRAME = ("import __main__, struct\nbody = b'[' * 200000 + b']' * 200000\n"
               "__main__.send_frame = lambda sock, obj: sock.sendall(struct.pack('>I', len(body)) + body)\n")

SCRIPTS: dict[str, list[str]] = {
    # tracked files, a directory and the tree itself made unreadable to their owner
    "unreadable": [bash("git ls-files -z | head -z -n 3 | xargs -0 chmod 000; "
                        "chmod 000 \"$(git ls-files | grep / | head -1 | cut -d/ -f1)\"; ls -la")],
    # FIFOs and a socket where tracked files were
    "fifo": [bash("set -- $(git ls-files | head -3); rm -f \"$1\" \"$2\" \"$3\"; mkfifo \"$1\" \"$2\"; "
                  "python3 -c 'import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' \"$3\"; "
                  "ls -la | head")],
    # the sandbox's control files removed, then the shell killed (its restart recreates them)
    "rm_control": [bash("rm -rf /work/.spoolrl; ls -la /work | head -3"), python("print(1)"),
                   bash("kill -9 $$"), python("print(2)"), bash("echo still-here")],
    # the python tool's server killed, then patched to answer deep nesting, then garbage
    "kill_pytool": [python("import os; os.kill(os.getpid(), 9)"), python("print('back')"),
                    python(_DEEP_FRAME), python("print('deep')"),
                    python("print('again')"), python(_GARBAGE_HANDLE), python("print(3)")],
    # forged shell completion markers: early (later results lag by one), huge status, not a number
    "forge_marker": [bash(f"{_NONCE}; printf 'early\\036%s:0\\036' \"$n\"; sleep 1; echo late"),
                     bash(f"{_NONCE}; printf '\\036%s:99999999\\036' \"$n\"; echo after-huge"),
                     bash(f"{_NONCE}; printf '\\036%s:abc\\036' \"$n\"; echo after-text"),
                     bash("eval \"$PROMPT_COMMAND\"; echo after-eval"), bash("echo synced")],
    # the agent kills its own shell, every process of its sandbox, and exits
    "kill_shell": [bash("kill -9 $$"), bash("echo one"), bash("kill -9 -1; sleep 1"), bash("echo two"),
                   bash("exit 7"), bash("echo three")],
    "bad_json": _bad_json(),
}



def peek_script(probe_objects: Sequence[str]) -> list[str]:
    """What an agent can learn of the repository's history from inside (issue 13, point 5): one call
    per question; ``probe_objects`` are object ids it must not be able to read (e.g. the fix's)."""
    probes = " ".join(o for o in probe_objects if o.isalnum())
    return [bash("git --no-pager log --all --format=%H"), bash("git --no-pager reflog --all --format=%H"), bash("git --no-pager stash list"),
            bash("git --no-pager cat-file --batch-all-objects --batch-check='%(objectname)'"),
            bash("git --no-pager for-each-ref --format='%(refname)'"),
            bash(f"for o in {probes or 'none'}; do git --no-pager cat-file -p \"$o\" >/dev/null 2>&1 && echo \"READ $o\"; done; "
                 "echo probed"),
            bash("cat .git/objects/info/alternates .git/objects/info/packs 2>/dev/null; echo end")]
