"""A short run of scripts/bench_gateway.py: both arms measured on the same calls, one segment per episode."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_bench_gateway_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("bench_gateway", ROOT / "scripts" / "bench_gateway.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(["--episodes", "2", "--turns", "3"])
    assert result["direct"]["calls"] == result["gateway"]["calls"] == result["overhead"]["calls"] == 6
    assert result["segments_per_episode"] == 1.0  # the history was resent unchanged: prefix merging held
    assert 0 < result["direct"]["p50_ms"] and 0 < result["gateway"]["p50_ms"]
    assert 0 < result["gateway_internal_ms_per_call"]
    assert "| overhead | 6 |" in capsys.readouterr().out
