"""``spoolrl harness install`` / ``harness check`` on a local directory (the stand-in harness), and the
config checks of ``rollout.harness.*`` (``spoolrl validate``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpc.config import load_config
from hpc.errors import ConfigError, UsageError
from rollout_node.agent.toolcall import format_tool_call
from rollout_node.pipeline.harness import HARNESS_INSIDE
from rollout_node.pipeline.harness_check import shell_call
from rollout_node.pipeline.harness_npm import link_commands, musl_triple
from tests.harness.conftest import STANDIN_SRC, spoolrl


def test_install_a_local_directory_then_check_it(tmp_path: Path) -> None:
    prefix = tmp_path / "standin"
    before = sorted(p.relative_to(STANDIN_SRC) for p in STANDIN_SRC.rglob("*"))
    done = spoolrl("harness", "install", str(STANDIN_SRC), "--prefix", str(prefix))
    assert done.returncode == 0, done.stderr
    assert sorted(p.relative_to(STANDIN_SRC) for p in STANDIN_SRC.rglob("*")) == before, "the source was left as it was"
    manifest = json.loads(done.stdout)
    assert manifest["python"] == "3.11" and "standin-harness" in manifest["console_scripts"]
    assert any(d.startswith("spoolrl-standin-harness==0.1") for d in manifest["distributions"])
    # made by the image's python, for the mount point every sandbox gives it
    assert (prefix / "bin" / "standin-harness").read_text().startswith(f"#!{HARNESS_INSIDE}/bin/python")
    assert os.readlink(prefix / "bin" / "python3") == "/usr/bin/python3"  # the image's interpreter
    again = spoolrl("harness", "install", str(STANDIN_SRC), "--prefix", str(prefix))
    assert again.returncode != 0 and "already exists" in again.stderr
    check = spoolrl("harness", "check", str(prefix), "--command", "standin-harness")
    assert check.returncode == 0, check.stdout + check.stderr
    lines = check.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["ok   install", "ok   scripts", "ok   gateway", "ok   episode"]
    assert "working tree changed" in lines[3] and "no network beyond it" in lines[2]


@pytest.mark.parametrize(("overrides", "message"), [
    ([], "rollout.harness.command: required with policy: harness"),
    (["rollout.harness.command=x"], "rollout.harness.prefix: required with policy: harness"),
    (["rollout.harness.command=x", "rollout.harness.prefix=rel/dir"], "rollout.harness.prefix: 'rel/dir' is not absolute"),
    (["rollout.harness.command=x", "rollout.harness.prefix=/a:b"], "rollout.harness.prefix: '/a:b' contains ','"),
    (["rollout.harness.command=x", "rollout.harness.prefix=/p", "rollout.harness.env={OPENAI_API_KEY: k}"],
     "rollout.harness.env: OPENAI_API_KEY is set by spoolrl"),
    (["rollout.harness.command=x", "rollout.harness.prefix=/p", "sandbox.runtime=local", "sandbox.allow_local=true"],
     "rollout.policy: harness needs an isolated sandbox"),
])
def test_config_checks_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.policy=harness", *overrides])
    assert message in str(err.value)


def test_validate_refuses_a_prefix_that_is_not_an_install(tmp_path: Path, standin_prefix: Path) -> None:
    base = ["rollout.policy=harness", "rollout.harness.command=standin-harness"]
    bad = spoolrl("validate", *base, f"rollout.harness.prefix={tmp_path}")
    assert bad.returncode == 2 and f"rollout.harness.prefix: {tmp_path} holds no harness install" in bad.stderr
    good = spoolrl("validate", *base, f"rollout.harness.prefix={standin_prefix}")
    assert good.returncode == 0, good.stderr
    # the demo refuses it too, before anything starts (no warm start, no run directory, no role)
    demo = spoolrl("demo", "--out", str(tmp_path / "run"), *base, f"rollout.harness.prefix={tmp_path}")
    assert demo.returncode == 2 and f"rollout.harness.prefix: {tmp_path} holds no harness install" in demo.stderr
    assert not (tmp_path / "run").exists() and "warm-started" not in demo.stderr


# a harness that asks for its own temperature (0.5): the gateway refuses it, whatever the backend
TEMPERATURE_CLIENT = ("python3 -c 'import json, os, urllib.request as u; u.urlopen(u.Request(os.environ[\"OPENAI_BASE_URL\"]"
                      " + \"/chat/completions\", data=json.dumps({\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}],"
                      " \"temperature\": 0.5}).encode(), headers={\"Authorization\": \"Bearer \" + os.environ[\"OPENAI_API_KEY\"]}))'")


def test_check_names_a_temperature_the_run_does_not_sample_at(tmp_path: Path, standin_prefix: Path) -> None:
    """The harness's sampling temperature must be the run's (the trainer scores one temperature): ``harness check``
    samples at the config's ``inference.temperature`` and says why the harness's call was refused."""
    config = tmp_path / "run.yaml"
    config.write_text("inference: {temperature: 0.7}\n")
    check = spoolrl("harness", "check", str(standin_prefix), "--config", str(config), "--command", TEMPERATURE_CLIENT)
    assert check.returncode == 1, check.stdout + check.stderr
    episode = check.stdout.split("FAIL episode: ", 1)[1]
    assert episode.startswith("exit 1, 0 gateway calls, 0 segment(s)"), episode
    assert ("the gateway refused a call: HTTP 400 on temperature: temperature 0.5 differs from the run's "
            "inference.temperature 0.7") in episode and "set it to 0.7" in episode


def _package(root: Path, name: str, meta: dict[str, object], files: tuple[str, ...] = ()) -> None:
    pkg = root / "npm" / "node_modules" / name
    pkg.mkdir(parents=True)
    (pkg / "package.json").write_text(json.dumps({"name": name, **meta}))
    for f in files:
        (pkg / f).parent.mkdir(parents=True, exist_ok=True)
        (pkg / f).write_text("#!/bin/sh\n")


def test_npm_commands_link_the_vendored_static_build_else_the_launcher(tmp_path: Path) -> None:
    """``npm:`` installs: a command whose package (or a platform dependency) vendors a static musl build links to
    it, relatively (the prefix is mounted elsewhere in the sandbox); any other command links to npm's launcher."""
    triple = musl_triple()
    _package(tmp_path, "@acme/agent", {"version": "1.2.0", "bin": {"agent": "bin/agent.js", "helper": "bin/h.js"}})
    _package(tmp_path, "@acme/agent-linux", {"version": "1.2.0-linux"}, (f"vendor/{triple}/bin/agent",))
    packages, commands = link_commands(tmp_path, "@acme/agent@1.2.0")
    assert commands == ["agent", "helper"] and packages == ["@acme/agent-linux==1.2.0-linux", "@acme/agent==1.2.0"]
    assert os.readlink(tmp_path / "bin" / "agent") == f"../npm/node_modules/@acme/agent-linux/vendor/{triple}/bin/agent"
    assert os.readlink(tmp_path / "bin" / "helper") == "../npm/node_modules/.bin/helper"
    with pytest.raises(UsageError, match="npm installed no @acme/other"):
        link_commands(tmp_path, "@acme/other@1")


def test_the_check_replies_call_the_shell_tool_the_harness_offers() -> None:
    """Codex CLI offers ``exec_command`` (argument ``cmd``), mini-swe-agent ``bash`` (``command``); a harness that
    sends no tools gets ``bash``, the built-in agent's format."""
    reply = shell_call("echo hi")
    codex = 'tools: [{"type": "function", "function": {"name": "exec_command", "parameters": {}}}, {"name": "bash"}]'
    assert reply(codex) == format_tool_call("exec_command", {"cmd": "echo hi"})
    assert reply('<tools>{"name": "bash", "parameters": {}}</tools>') == format_tool_call("bash", {"command": "echo hi"})
    assert reply("no tools in this prompt") == format_tool_call("bash", {"command": "echo hi"})
    assert reply('{"name":"shell"}') == format_tool_call("shell", {"command": "echo hi"})
