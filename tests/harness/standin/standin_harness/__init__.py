"""A stand-in agent harness (tests only): an OpenAI chat client on the standard library.

It reads the task from stdin, then loops: POST the history to $OPENAI_BASE_URL/chat/completions with
$OPENAI_API_KEY, append the assistant message exactly as returned, run each ``bash`` tool call and append
its output as a ``tool`` message. A command starting with ``@`` is a directive instead: ``@done`` exits 0,
``@crash`` exits 3, ``@sleep`` sleeps (forever, with a child that does too), ``@truncate`` drops the history
back to the system and user messages (a harness that rewrites its history: a new segment), ``@net`` tries
the network outside the sandbox and reports what it reached as the tool output.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a bash command",
                                           "parameters": {"type": "object",
                                                          "properties": {"command": {"type": "string"}},
                                                          "required": ["command"]}}}]


def chat(messages):
    body = json.dumps({"model": "policy", "messages": messages, "tools": TOOLS}).encode()
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                 headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.load(resp)["choices"][0]["message"]


def network():
    reached = []
    for host, port in (("1.1.1.1", 53), ("8.8.8.8", 443), ("pypi.org", 443)):
        try:
            socket.create_connection((host, port), timeout=3).close()
            reached.append(f"{host}:{port}")
        except OSError as exc:
            reached.append(f"{host}:{port} unreachable ({type(exc).__name__})")
    return "; ".join(reached)


def main():
    task = sys.stdin.read()
    base = [{"role": "system", "content": "You are a stand-in agent."}, {"role": "user", "content": task}]
    messages = list(base)
    for _ in range(20):
        message = chat(messages)
        messages.append(message)
        for call in message.get("tool_calls") or []:
            command = json.loads(call["function"]["arguments"])["command"]
            if command == "@done":
                return 0
            if command == "@crash":
                return 3
            if command == "@sleep":
                subprocess.Popen(["sleep", "3600"])
                time.sleep(3600)
            if command == "@truncate":
                messages = list(base)
                break
            if command == "@net":
                output = network()
            else:
                proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
                output = proc.stdout + proc.stderr
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return 0


if __name__ == "__main__":
    sys.exit(main())
