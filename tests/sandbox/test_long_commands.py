"""Commands of any length run exactly in the agent's bash (real PTY, bwrap and local), up to
``framing.MAX_COMMAND_BYTES``; past it, or when the command did not arrive whole, the agent gets
a clear error and nothing runs - never a truncated command with a success status."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest

from hpc.config.sandbox import SandboxConfig
from rollout_node.sandbox import open_sandbox
from rollout_node.sandbox.framing import DIRECT_MAX_BYTES, MAX_COMMAND_BYTES
from rollout_node.sandbox.sandbox import Sandbox
from tests.sandbox.sbx_helpers import need_runtime

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module", params=["bwrap", "local"])
def sb(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    need_runtime(request.param)
    cfg = SandboxConfig(runtime=request.param, allow_local=request.param == "local")
    with open_sandbox(cfg, tmp_path_factory.mktemp(f"long-{request.param}")) as box:
        yield box


def test_a_line_past_the_terminal_limit_runs_exactly(sb: Sandbox) -> None:
    r = sb.run("printf %s " + "a" * 5000 + " | wc -c")
    assert (r.output, r.exit_code) == ("5000\n", 0)


def test_a_heredoc_of_tens_of_kb_is_written_byte_for_byte(sb: Sandbox) -> None:
    odd = "é$`\\" * 10 + " 'q' \"d\" $(false)"
    text = "".join(f"line {i}: {odd}\n" for i in range(1500))  # ~100 KB: quotes, expansions, UTF-8
    assert len(text.encode()) > 40 * DIRECT_MAX_BYTES
    r = sb.run(f"cd {sb.inside} && cat > big.txt <<'END'\n{text}END\nexport AFTER_LONG=1\nsha256sum big.txt",
               timeout_s=60)
    assert r.exit_code == 0 and r.output.split()[0] == hashlib.sha256(text.encode()).hexdigest(), r.output
    assert sb.run("echo $AFTER_LONG").output == "1\n", "a long command runs in the same shell"
    assert sb.run(": " + "x" * 4000 + "\n(exit 3)").exit_code == 3, "its exit status comes back"


def test_past_the_limit_nothing_runs_and_the_error_says_why(sb: Sandbox) -> None:
    r = sb.run(f"touch {sb.inside}/too-long; : " + "x" * MAX_COMMAND_BYTES)
    assert r.exit_code is None and not r.ok and str(MAX_COMMAND_BYTES) in r.output, r.output
    assert not (sb.workdir / "too-long").exists()
    assert sb.run("echo still here").output == "still here\n"


def test_a_command_that_does_not_arrive_whole_is_refused(sb: Sandbox) -> None:
    sb.run("base64() { head -c 100; }")  # what a broken or shadowed decoder does
    r = sb.run(f"touch {sb.inside}/mangled; : " + "y" * 5000)
    assert r.exit_code == 126 and "did not arrive intact" in r.output, r.output
    assert not (sb.workdir / "mangled").exists()
    sb.run("unset -f base64")
    assert sb.run(": " + "z" * 5000 + "; echo ok").output == "ok\n"


def test_a_nul_byte_is_refused(sb: Sandbox) -> None:
    r = sb.run("echo a\0b")
    assert r.exit_code is None and "NUL" in r.output
