"""The agent's tools through a real sandbox (bwrap, and the local runtime): semantics of run,
exec, python, the file tools and submit, closing, the CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc.config.sandbox import SandboxConfig
from hpc.errors import SandboxError
from rollout_node.sandbox import ToolResult, open_sandbox
from rollout_node.sandbox.limits import descendants
from rollout_node.sandbox.sandbox import Sandbox
from tests.sandbox.sbx_helpers import need_runtime

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module", params=["bwrap", "local"])
def sb(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    need_runtime(request.param)
    cfg = SandboxConfig(runtime=request.param, allow_local=request.param == "local", max_output_kb=4)
    with open_sandbox(cfg, tmp_path_factory.mktemp(f"tools-{request.param}")) as box:
        yield box


def test_run_basics(sb: Sandbox) -> None:
    r = sb.run("echo hi")
    assert isinstance(r, ToolResult) and r.output == "hi\n" and r.exit_code == 0 and not r.timed_out
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.output = "x"  # type: ignore[misc]
    assert sb.run("false").exit_code == 1
    assert sb.run("printf no-newline").output == "no-newline"
    assert sb.run("for i in 1 2; do\necho $i\ndone\necho three").output == "1\n2\nthree\n"
    assert sb.run("(exit 7)").exit_code == 7


def test_cwd_and_env_persist(sb: Sandbox) -> None:
    sb.run("mkdir -p sub && cd sub && export SPOOLRL_T=42")
    r = sb.run("pwd; echo $SPOOLRL_T")
    assert r.output == f"{sb.inside}/sub\n42\n"
    sb.run(f"cd {sb.inside}")


def test_timeout_interrupts_and_shell_survives(sb: Sandbox) -> None:
    sb.run("export KEEP=yes")
    r = sb.run("echo started; sleep 100", timeout_s=0.5)
    assert r.timed_out and r.exit_code == 130 and r.output.startswith("started")
    assert sb.run("echo $KEEP").output == "yes\n"  # same shell: state kept


def test_sigint_immune_job_kills_and_respawns(sb: Sandbox) -> None:
    sb.run("export GONE=no")
    r = sb.run("trap '' INT; sleep 100", timeout_s=0.5)
    assert r.timed_out and r.exit_code is None and "new shell" in r.output
    assert sb.run("echo ${GONE:-reset}").output == "reset\n"


def test_output_truncated_head_and_tail(sb: Sandbox) -> None:
    r = sb.run("seq 1 200000")
    keep = sb.keep
    assert r.truncated and r.exit_code == 0
    assert r.total_bytes == len("".join(f"{i}\n" for i in range(1, 200001)))
    assert r.output.startswith("1\n2\n3\n") and r.output.endswith("199999\n200000\n")
    assert len(r.output.encode()) < 2 * keep + 100


def test_shell_exit_is_detected_and_respawned(sb: Sandbox) -> None:
    r = sb.run("exit 3")
    assert r.exit_code == 3 and "new shell" in r.output
    assert sb.run("echo back").output == "back\n"


def test_exec_is_fresh_and_shares_workdir(sb: Sandbox) -> None:
    sb.run("export ONLY_IN_SHELL=1; echo data > shared.txt")
    r = sb.exec(["bash", "-c", "echo ${ONLY_IN_SHELL:-unset}; cat shared.txt; exit 4"], timeout_s=30)
    assert r.output == "unset\ndata\n" and r.exit_code == 4
    t = sb.exec(["sleep", "100"], timeout_s=0.5)
    assert t.timed_out and t.exit_code is None


def test_python_tool_state_and_errors(sb: Sandbox) -> None:
    assert sb.python("x = 20").exit_code == 0
    assert sb.python("x * 2 + 2").output == "42\n"
    r = sb.python("1 / 0")
    assert r.exit_code == 1 and "ZeroDivisionError" in r.output
    assert sb.python("import sys; sys.exit(3)").exit_code == 3
    t = sb.python("import time\nwhile True: time.sleep(0.05)", timeout_s=0.5)
    assert t.timed_out and sb.python("print(x)").output == "20\n"  # interrupted, state kept
    big = sb.python("print('y' * 100000)")
    assert big.truncated and big.total_bytes == 100001


def test_python_socket_path_short_for_deep_workdir(tmp_path: Path) -> None:
    need_runtime("bwrap")
    deep = tmp_path / ("d" * 100) / ("e" * 100)
    with open_sandbox(SandboxConfig(), deep) as box:
        assert len(str(deep / ".spoolrl" / "py.sock")) > 107
        assert box.python("print('deep ok')").output == "deep ok\n"


def test_file_tools(sb: Sandbox) -> None:
    assert sb.create("pkg/mod.py", "a = 1\nb = 2\nc = 3\n").exit_code == 0
    assert sb.create("pkg/mod.py", "again").exit_code == 1  # exists
    v = sb.view("pkg/mod.py")
    assert v.output == "     1\ta = 1\n     2\tb = 2\n     3\tc = 3\n     4\t\n"
    assert sb.view(f"{sb.inside}/pkg/mod.py", (2, 3)).output == "     2\tb = 2\n     3\tc = 3\n"
    assert sb.str_replace("pkg/mod.py", "b = 2", "b = 20").exit_code == 0
    assert sb.str_replace("pkg/mod.py", "nothere", "x").exit_code == 1
    sb.create("dup.txt", "x\nx\n")
    dup = sb.str_replace("dup.txt", "x", "y")
    assert dup.exit_code == 1 and "2 times" in dup.output
    assert sb.insert("pkg/mod.py", 1, "inserted = True").exit_code == 0
    assert sb.run("cat pkg/mod.py").output == "a = 1\ninserted = True\nb = 20\nc = 3\n"
    assert "mod.py" in sb.view("pkg").output
    assert sb.view("/etc/passwd").exit_code == 1


def test_submit_returns_the_diff(sb: Sandbox) -> None:
    sb.run("mkdir -p repo && cd repo && git init -q && git config user.email a@b && git config user.name a && "
           "echo one > f.txt && git add f.txt && git commit -qm init")
    sb.run(f"cd {sb.inside}")
    sb.create("repo/f.txt", "two\n", overwrite=True)
    sb.create("repo/new.txt", "new\n")
    r = sb.submit("repo")
    assert r.exit_code == 0, r.output
    assert "-one\n+two" in r.output and "new.txt" in r.output and ".spoolrl" not in r.output
    assert sb.submission == r.output


def test_close_is_idempotent_and_leaves_nothing(tmp_path: Path) -> None:
    need_runtime("bwrap")
    box = open_sandbox(SandboxConfig(), tmp_path)
    box.run("sleep 1000 & setsid sleep 1001 &")
    box.python("1")
    pid = box.shell.pid
    assert pid is not None and len(descendants([pid])) >= 4
    box.close()
    box.close()
    assert descendants([pid]) == []
    assert not (tmp_path / ".spoolrl").exists()
    with pytest.raises(SandboxError):
        box.run("true")


def test_sandbox_outlives_the_thread_that_started_it(tmp_path: Path) -> None:
    """bwrap --die-with-parent is per thread: spawning from a worker thread must not kill the shell."""
    need_runtime("bwrap")
    holder: list[Sandbox] = []
    t = threading.Thread(target=lambda: holder.append(open_sandbox(SandboxConfig(), tmp_path)))
    t.start()
    t.join()
    with holder[0] as box:
        assert box.run("echo alive").output == "alive\n"
        assert box.run("exit 1").exit_code == 1  # respawned from this thread ...
    box2 = holder[0]
    assert box2.shell.proc is None


def test_local_runtime_needs_opt_in(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="allow_local"):
        open_sandbox(SandboxConfig(runtime="local"), tmp_path)


def test_cli_exec_prints_one_json_object(tmp_path: Path) -> None:
    need_runtime("bwrap")
    proc = subprocess.run([sys.executable, "-m", "hpc.cli", "sandbox", "exec", "--runtime", "bwrap",
                           "--workdir", str(tmp_path), "--timeout-s", "20", "--", "echo hi; (exit 5)"],
                          capture_output=True, text=True, timeout=120, env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert {"output", "exit_code", "timed_out", "truncated", "duration_s"} <= set(result)
    assert result["output"] == "hi\n" and result["exit_code"] == 5 and result["timed_out"] is False


def test_cli_exec_runs_argv_exactly(tmp_path: Path) -> None:
    need_runtime("bwrap")
    argvs = {"hello-42\n": ["bash", "-c", "echo hello-$((6*7))"],
             "a b|$HOME|'q'\n": ["printf", "%s|%s|%s\\n", "a b", "$HOME", "'q'"]}
    for want, argv in argvs.items():
        proc = subprocess.run([sys.executable, "-m", "hpc.cli", "sandbox", "exec", "--runtime", "bwrap",
                               "--workdir", str(tmp_path), "--", *argv],
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        assert (result["output"], result["exit_code"]) == (want, 0), argv


@pytest.mark.parametrize("excluded", [True, False])
def test_submit_of_the_work_dir_leaves_out_the_control_dir(sb: Sandbox, excluded: bool) -> None:
    """The work dir is the repo (as INIT makes it), with the sandbox's control dir inside it, listed in
    .git/info/exclude (INIT's junk patterns) or not (an agent removed the line): submit works and the
    diff never carries control files."""
    sb.run("git init -q . && git config user.email a@b && git config user.name a && echo one > f.txt && "
           "git add f.txt && git commit -qm init")
    if excluded:
        sb.run("echo '.spoolrl/' >> .git/info/exclude")
    sb.create("f.txt", "two\n", overwrite=True)
    r = sb.submit(".")
    assert r.exit_code == 0, r.output
    assert "-one\n+two" in r.output and ".spoolrl" not in r.output


def test_a_watchdog_kill_is_reported_by_the_tool_it_ended_only(tmp_path: Path) -> None:
    """The shell's sandbox killed between commands (a background process past the limit): the next
    ``exec`` (what submit and EVAL use) is not marked as killed, the next shell command reports it."""
    need_runtime("bwrap")
    cfg = SandboxConfig(runtime="bwrap", max_procs=32)
    with open_sandbox(cfg, tmp_path / "w") as box:
        first = box.shell.pid
        assert box.run("(for i in $(seq 40); do sleep 30 & done; wait) >/dev/null 2>&1 &").exit_code == 0
        deadline = time.monotonic() + 20
        while box.shell.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not box.shell.alive(), "the watchdog did not kill the sandbox past max_procs"
        ran = box.exec(["true"])
        assert ran.exit_code == 0 and "watchdog" not in ran.output, ran
        told = box.run("echo after")
        assert "sandbox killed by the watchdog" in told.output and "max_procs 32" in told.output, told
        assert box.shell.pid != first and box.run("echo again").output == "again\n"
