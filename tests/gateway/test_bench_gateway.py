"""A short run of scripts/bench_gateway.py: both arms measured on the same calls, one segment per episode; one
example-harness episode in a bwrap sandbox with its wall time split into LLM, gateway and the rest."""

from __future__ import annotations

import pytest

from rollout_node.sandbox import bwrap_unavailable_reason
from tests.harness.conftest import example_install
from tests.scripts_loader import load_script


def test_bench_gateway_smoke(capsys: pytest.CaptureFixture[str], tmp_path_factory: pytest.TempPathFactory) -> None:
    if why := bwrap_unavailable_reason():
        pytest.skip(why)
    bench = load_script("bench_gateway")
    result = bench.main(["--episodes", "2", "--turns", "3", "--harness-episodes", "1", "--harness-turns", "2",
                         "--harness-latency-s", "0.05", "--harness-prefix", str(example_install(tmp_path_factory))])
    assert result["direct"]["calls"] == result["gateway"]["calls"] == result["overhead"]["calls"] == 6
    assert result["segments_per_episode"] == 1.0  # the history was resent unchanged: prefix merging held
    assert 0 < result["direct"]["p50_ms"] and 0 < result["gateway"]["p50_ms"]
    assert 0 < result["gateway_internal_ms_per_call"]
    h = result["harness"]
    assert (h["calls"], h["segments"]) == (3, 1)  # two bash calls and submit, one token-exact segment
    assert h["llm_s"] >= 3 * 0.05 and h["gateway_s"] > 0 and h["rest_s"] > 0 and h["sandbox_start_s"] > 0
    assert abs(h["llm_s"] + h["gateway_s"] + h["rest_s"] - h["wall_s"]) < 1e-3
    out = capsys.readouterr().out
    assert "| overhead | 6 |" in out and "| LLM (backend) |" in out and "| tools + harness (the rest) |" in out
