"""A small agent harness on the standard library: an OpenAI chat-completions client with three tools.

It is what ``rollout.policy: harness`` trains in the README's example (``spoolrl demo
rollout.policy=harness ...``), and a template for your own: nothing in it knows about spoolrl beyond
the environment every harness gets.

- The task: the text of ``$SPOOLRL_TASK_FILE`` (else stdin).
- The model: ``POST $OPENAI_BASE_URL/chat/completions`` with ``Authorization: Bearer $OPENAI_API_KEY``,
  the whole history each turn (each assistant message sent back exactly as it came), the tools as
  OpenAI ``tools`` (``--no-tools-field``: not sent, for a model that learnt them without their schema in
  its prompt, as the demo's warm-started tiny model did; its ``<tool_call>`` blocks still come back as
  ``tool_calls``); no sampling fields (the run decides them).
- The tools run in the current directory (the task's working tree): ``bash`` (a command, its output and
  exit status), ``str_replace`` (replace the one occurrence of ``old`` in the file at ``path`` with ``new``)
  and ``submit`` (stop: the working tree is the result). A reply without a tool call ends the episode too.
- It stops after ``--max-turns`` calls; an HTTP error from the server (e.g. a 400 for a sampling field the
  trainer cannot reproduce) is printed and ends it with status 2.
"""

import argparse
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

SYSTEM = ("You are a software engineer. Fix the repository at /work with one tool call per turn, as JSON "
          "inside <tool_call> tags, then submit.")
TOOLS = [
    {"type": "function", "function": {
        "name": "bash", "description": "run a bash command in the repository",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "str_replace", "description": "replace the one occurrence of old with new in the file at path",
        "parameters": {"type": "object", "required": ["path", "old", "new"], "properties": {
            "path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "submit", "description": "finish; your changes to the repository are evaluated",
        "parameters": {"type": "object", "properties": {}}}},
]
OUTPUT_MAX = 4000  # characters of a tool's output sent back to the model


def chat(messages, model, tools):
    body = json.dumps({"model": model, "messages": messages, **({"tools": TOOLS} if tools else {})}).encode()
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions", data=body,
                                 headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.load(resp)["choices"][0]["message"]


def bash(command):
    try:
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "error: the command took longer than 120 s"
    return f"{proc.stdout}{proc.stderr}[exit status {proc.returncode}]"


def str_replace(path, old, new):
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        return f"error: {exc}"
    count = text.count(old) if old else 0
    if count != 1:
        return f"error: old occurs {count} times in {path}; it must occur exactly once"
    with open(path, "w") as f:
        f.write(text.replace(old, new, 1))
    return f"edited {path}"


def run_tool(name, arguments):
    """A tool's output for the model (None: the episode ends)."""
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
        if name == "submit":
            return None
        if name == "bash":
            return bash(str(args["command"]))
        if name == "str_replace":
            return str_replace(str(args["path"]), str(args["old"]), str(args["new"]))
    except (ValueError, TypeError, KeyError) as exc:
        return f"error: bad arguments for {name}: {exc!r}"
    return f"error: unknown tool {name!r}; use bash, str_replace or submit"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-turns", type=int, default=10, help="model calls at most (default 10)")
    p.add_argument("--model", default="policy", help="the model name sent (default policy)")
    p.add_argument("--system", default=SYSTEM, help="the system prompt")
    p.add_argument("--tools-field", action=argparse.BooleanOptionalAction, default=True,
                   help="send the tools' schema as the request's tools (default; --no-tools-field: leave it out)")
    args = p.parse_args(argv)
    task_file = os.environ.get("SPOOLRL_TASK_FILE")
    task = open(task_file).read() if task_file else sys.stdin.read()
    messages = [{"role": "system", "content": args.system}, {"role": "user", "content": task.strip()}]
    for turn in range(args.max_turns):
        try:
            message = chat(messages, args.model, args.tools_field)
        except urllib.error.HTTPError as exc:
            print(f"turn {turn}: the server refused the call: HTTP {exc.code}: {exc.read().decode()[:2000]}",
                  file=sys.stderr)
            return 2
        messages.append(message)
        calls = message.get("tool_calls") or []
        print(f"turn {turn}: {[c['function']['name'] for c in calls] or 'no tool call: done'}", flush=True)
        for call in calls:
            output = run_tool(call["function"]["name"], call["function"].get("arguments") or "{}")
            if output is None:
                return 0
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output[-OUTPUT_MAX:]})
        if not calls:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
