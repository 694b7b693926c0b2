"""``spoolrl harness check DIR``: run a harness install once in a sandbox against a scripted backend and
say what works.

The checks, in order (each one line, ``ok`` or ``FAIL``; a failure stops the later ones that need it):
``install`` (DIR's manifest), ``scripts`` (every console script is on the sandbox's PATH), ``gateway``
(a stdlib client inside the sandbox reaches ``GET /v1/models`` through the loopback relay with the
session key, and the network beyond is unreachable), and, given a command, ``episode``: the command runs
once on a scratch git repository against a scripted backend (:class:`~rollout_node.pipeline.harness.ScriptedBackend`:
it answers with ``CHECK_REPLIES``: a call of the shell tool the harness offers that writes a file, then
mini-swe-agent's submit command, then a plain answer that ends a harness like Codex CLI)
and passes when the harness called the gateway, the trace holds one segment or more, and the working
tree changed.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpc.config.rollout import HarnessConfig
from hpc.config.sandbox import SandboxConfig
from hpc.errors import SpoolrlError
from rollout_node.agent.toolcall import format_tool_call
from rollout_node.pipeline.agentscript import byte_template
from rollout_node.pipeline.harness import ScriptedBackend, run_harness
from rollout_node.pipeline.harness_install import InstallManifest

if TYPE_CHECKING:
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.gateway.server import Gateway
    from rollout_node.gateway.session import GatewaySampling
    from rollout_node.sandbox.sandbox import Sandbox

CHECK_FILE = "SPOOLRL_HARNESS_CHECK.txt"
# the shell tools of the harnesses we know, (tool, its command argument): Codex CLI's, then mini-swe-agent's
SHELL_TOOLS = (("exec_command", "cmd"), ("bash", "command"), ("shell", "command"))


def shell_call(command: str) -> Callable[[str], str]:
    """A scripted reply that runs ``command`` through the first of :data:`SHELL_TOOLS` the prompt offers
    (its rendered tools), else through ``bash`` (a harness that sends no tools: the built-in agent's format)."""
    def reply(prompt: str) -> str:
        offered = [(tool, arg) for tool, arg in SHELL_TOOLS if re.search(rf'"name":\s*"{tool}"', prompt)]
        tool, arg = offered[0] if offered else SHELL_TOOLS[1]
        return format_tool_call(tool, {arg: command})
    return reply


# write the file, then mini-swe-agent's submit command; a harness that ends on a plain answer (Codex) gets one
CHECK_REPLIES = (shell_call(f"echo harness-check > {CHECK_FILE}"), shell_call("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
                 "The file is written.")
CHECK_TASK = f"Create the file {CHECK_FILE} holding the line 'harness-check'."
# inside the sandbox: the gateway through the relay, then the outside world (which must be unreachable)
PROBE = """import json, os, socket, urllib.request
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/models",
                             headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
models = json.load(urllib.request.urlopen(req, timeout=30))
outside = []
for host, port in (("1.1.1.1", 53), ("8.8.8.8", 443)):
    try:
        socket.create_connection((host, port), timeout=3).close()
        outside.append(f"{host}:{port}")
    except OSError:
        pass
print(json.dumps({"models": [m["id"] for m in models["data"]], "reached": outside}))
"""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name}: {self.detail}"


def _git_repo(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "README.md").write_text("harness check\n")
    for argv in (["init", "-q"], ["add", "-A"], ["-c", "user.name=spoolrl", "-c", "user.email=spoolrl@localhost",
                                                  "commit", "-q", "-m", "base"]):
        subprocess.run(["git", *argv], cwd=path, check=True, capture_output=True)


def check_install(prefix: Path, sandbox: SandboxConfig, command: str = "", env: dict[str, str] | None = None,
                  *, temperature: float = 1.0, replies: Sequence[str | Callable[[str], str]] = CHECK_REPLIES,
                  timeout_s: float = 300.0) -> list[Check]:
    """Run the checks of the module docstring (the gateway samples at ``temperature``, the run's
    ``inference.temperature``: a harness that asks for another one fails the episode check, as it would
    fail every episode); never raises for what it checks."""
    from rollout_node.gateway.server import Gateway
    from rollout_node.gateway.session import GatewaySampling
    from rollout_node.sandbox import open_sandbox

    try:
        manifest = InstallManifest.read(prefix)
    except SpoolrlError as exc:
        return [Check("install", False, str(exc))]
    checks = [Check("install", True, f"{manifest.spec} (python {manifest.python}, "
                                     f"{len(manifest.distributions)} distributions)")]
    template = byte_template()
    backend = ScriptedBackend(template, list(replies))
    sampling = GatewaySampling(temperature=temperature, max_tokens=1 << 22, max_new_tokens=1 << 16)
    with tempfile.TemporaryDirectory(prefix="spoolrl-harness-check-") as tmp:
        work = Path(tmp) / "work"
        _git_repo(work)
        with Gateway(Path(tmp) / "gw.sock").start() as gateway, open_sandbox(sandbox, work) as sb:
            probe_cfg = HarnessConfig(command="", prefix=str(prefix), env=dict(env or {}))
            scripts = " ".join(manifest.console_scripts)
            found = run_harness(sb, _with(probe_cfg, f"for s in {scripts}; do command -v \"$s\" >/dev/null || "
                                                     "echo \"missing: $s\"; done"),
                                key="-", socket_path=gateway.socket_path, problem=CHECK_TASK,
                                stop=lambda: False, timeout_s=60.0)
            missing = [ln.split(": ", 1)[1] for ln in str(found.output).splitlines() if ln.startswith("missing: ")]
            checks.append(Check("scripts", found.exit_code == 0 and not missing,
                                f"missing on PATH: {missing}" if missing else
                                f"{len(manifest.console_scripts)} console scripts on PATH ({scripts[:200]})"))
            session = gateway.open_session("check-probe", backend, template, sampling)
            probe = run_harness(sb, _with(probe_cfg, "python3 -c " + shlex.quote(PROBE)), key=session.key,
                                socket_path=gateway.socket_path, problem=CHECK_TASK, stop=lambda: False,
                                timeout_s=60.0)
            session.close()
            checks.append(_gateway_check(str(probe.output), probe.exit_code))
            if command:
                checks.append(_episode(sb, gateway, _with(probe_cfg, command), backend, template, sampling, work,
                                       timeout_s))
    return checks


def _with(cfg: HarnessConfig, command: str) -> HarnessConfig:
    return HarnessConfig(command=command, env=cfg.env, prefix=cfg.prefix, submit=cfg.submit)


def _gateway_check(output: str, code: int | None) -> Check:
    try:
        seen = json.loads(output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Check("gateway", False, f"the probe inside the sandbox failed (exit {code}): {output[-800:]}")
    if seen["reached"]:
        return Check("gateway", False, f"the sandbox reached the network: {seen['reached']}")
    return Check("gateway", True, f"relay -> gateway ok (models {seen['models']}); no network beyond it")


def _episode(sb: Sandbox, gateway: Gateway, cfg: HarnessConfig, backend: ScriptedBackend, template: ChatTemplate,
             sampling: GatewaySampling, work: Path, timeout_s: float) -> Check:
    session = gateway.open_session("check-episode", backend, template, sampling)
    try:
        result = run_harness(sb, cfg, key=session.key, socket_path=session.socket_path, problem=CHECK_TASK,
                             stop=lambda: False, timeout_s=timeout_s)
    finally:
        trace = session.close()
    changed = (work / CHECK_FILE).exists()
    detail = (f"exit {result.exit_code}{' (timed out)' if result.timed_out else ''}, {trace.calls} gateway calls, "
              f"{len(trace.segments)} segment(s), {trace.reprefill_tokens} tokens prefilled again, "
              f"working tree {'changed' if changed else 'unchanged'}")
    if trace.error:
        detail += f"; gateway error: {trace.error}"
    if trace.refused:
        detail += f"; the gateway refused a call: {trace.refused}"
    ok = trace.calls > 0 and bool(trace.segments) and changed and not trace.error
    if not ok:
        detail += f"\n{str(result.output)[-1500:]}"
    return Check("episode", ok, detail)
