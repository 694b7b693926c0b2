"""Process entry of ``spoolrl serve``: listen, load, announce readiness, stop cleanly on SIGTERM.

Guarantees: the socket is bound first (``/health`` answers 503 meanwhile), the ready file is
written atomically only after the model loaded, SIGTERM/SIGINT shut the server down and exit 0,
a model that fails to load exits non-zero with the reason on stderr.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from hpc.config.inference import CPU_MAX_BATCH, CPU_PREFIX_CACHE_MB
from hpc.errors import UsageError
from hpc.fsutil import atomic_write_json
from hpc.httpserver import HttpServer
from train_node.infer.httpbase import read_secret, route_app
from train_node.infer.server import App, ServeOptions, make_handler


@dataclasses.dataclass(frozen=True)
class ServeArgs:
    model: str
    port: int = 0
    host: str = "127.0.0.1"
    uds: str | None = None
    version: int = 0
    served_model_name: str = "policy"
    dtype: str = "float32"
    threads: int = 0
    max_batch: int = CPU_MAX_BATCH
    prefix_cache_mb: int = CPU_PREFIX_CACHE_MB
    max_model_len: int = 0
    secret_file: str | None = None
    require_auth_all: bool = False
    ready_file: str | None = None


def run_serve(args: ServeArgs) -> int:
    if not Path(args.model, "config.json").exists():
        raise UsageError(f"--model {args.model}: no config.json there; give an HF checkpoint directory")
    if args.prefix_cache_mb < 0:
        raise UsageError(f"--prefix-cache-mb {args.prefix_cache_mb}: give 0 (off) or more MiB")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    options = ServeOptions(served_model_name=args.served_model_name, dtype=args.dtype, max_batch=args.max_batch,
                           prefix_cache_mb=args.prefix_cache_mb, max_model_len=args.max_model_len or None, secret=read_secret(args.secret_file),
                           require_auth_all=args.require_auth_all)
    app = App(options)
    server = HttpServer(route_app(make_handler(app)), host=args.host, port=args.port, uds=args.uds)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Slurm's time-limit warning (--signal=USR1@drain_s) reaches every process of the step: the rollout
    # group is draining and needs its episodes answered, so servers keep serving until SIGTERM.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    server.start()
    url = server.url
    try:
        app.load(args.model, args.version)
    except Exception as exc:
        print(f"spoolrl serve: could not load {args.model}: {type(exc).__name__}: {exc}", file=sys.stderr)
        server.close()
        return 1
    if args.ready_file:
        atomic_write_json(Path(args.ready_file), {"url": url, "pid": os.getpid(), "version": args.version})
    print(f"spoolrl serve: {url} serving {args.model} (version {args.version})", file=sys.stderr, flush=True)
    while not stop.wait(0.5):
        pass
    server.close()  # removes the Unix socket
    app.close()
    return 0
