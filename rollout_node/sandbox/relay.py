"""The loopback relay: runs INSIDE a sandbox that has no network, so an unmodified harness can reach
its gateway at ``http://127.0.0.1:PORT``.

Standard library only (any python3 >= 3.6 in any image); the node passes this file's text as
``python3 -c SOURCE SOCKET PORT_FILE``. The relay listens on a free port of the sandbox's own
loopback (its network namespace's ``lo``, which bwrap and apptainer ``--network none`` bring up),
writes the port number to ``PORT_FILE`` (atomically: a reader never sees a partial number), and
copies the bytes of every accepted connection to and from a new connection to the Unix socket
``SOCKET`` (the gateway's, bind-mounted into the sandbox). It parses nothing: HTTP keep-alive,
streaming and pipelining pass through unchanged.

Guarantees: it never connects anywhere but ``SOCKET``; one connection's failure closes that
connection only; it dies with the sandbox (its pid namespace).
"""

from __future__ import annotations

import os
import socket
import sys
import threading

CHUNK = 1 << 16


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until EOF, then half-close ``dst`` (the other direction may go on)."""
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _serve(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def main(path: str, port_file: str) -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.getsockname()[1]))
    os.replace(tmp, port_file)
    while True:
        client, _ = server.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_serve, args=(client, path), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
