"""hpc.httpserver.HttpServer: TCP and Unix socket, the socket file's mode and its stale predecessor, close."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path

import pytest
from aiohttp import web

from hpc.httpserver import HttpServer


def _app() -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"path": request.path})

    app = web.Application()
    app.add_routes([web.get("/{tail:.*}", hello)])
    return app


def _get_unix(path: str, route: str) -> dict[str, str]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        sock.sendall(f"GET {route} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b"".join(iter(lambda: sock.recv(65536), b""))
    return dict(json.loads(data.split(b"\r\n\r\n", 1)[1]))


def test_tcp_port_is_known_before_start_and_freed_by_close() -> None:
    server = HttpServer(_app())
    port = server.port
    assert port > 0 and server.url == f"http://127.0.0.1:{port}"
    server.start()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/a")
    assert json.loads(conn.getresponse().read()) == {"path": "/a"}
    conn.close()
    server.close()
    server.close()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_unix_socket_is_private_replaces_a_stale_one_and_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # a predecessor's socket file, nobody listening
    stale.close()
    server = HttpServer(_app(), uds=str(path)).start()
    try:
        assert path.stat().st_mode & 0o777 == 0o600 and server.url == f"unix://{path}"
        assert _get_unix(str(path), "/b") == {"path": "/b"}
    finally:
        server.close()
    assert not path.exists()


def test_a_file_that_is_not_a_socket_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("keep me")
    with pytest.raises(OSError):
        HttpServer(_app(), uds=str(path))
    assert path.read_text() == "keep me"
