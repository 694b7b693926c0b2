"""A forged completion marker with a huge status (the nonce is readable in $PROMPT_COMMAND) is output,
not an exception in the node (issue 13, point 4)."""

from __future__ import annotations

from pathlib import Path

from hpc.config.sandbox import SandboxConfig
from rollout_node.sandbox import bwrap_unavailable_reason, open_sandbox

FORGE = ('n=${PROMPT_COMMAND#*036}; n=${n%%:*}; printf "\\036$n:%s\\036" "$(printf "9%.0s" $(seq 5000))"; '
         'echo after-forgery')


def test_forged_marker_with_a_huge_status_is_just_output(tmp_path: Path) -> None:
    assert not bwrap_unavailable_reason(), bwrap_unavailable_reason()
    with open_sandbox(SandboxConfig(), tmp_path / "work") as sandbox:
        result = sandbox.run(FORGE, timeout_s=20)
        assert result.exit_code == 0 and "after-forgery" in result.output, result
        assert "99999" in result.output
        again = sandbox.run("echo still-here", timeout_s=20)
        assert (again.exit_code, again.output.strip()) == (0, "still-here")
