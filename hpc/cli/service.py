"""``spoolrl rollout-server [--config FILE] [key=value ...] [--run RUN] [--host H] [--port P]
[--trust-network CIDR[,CIDR...]] [--no-auth] [--[no-]token-level]``:
Rollout-as-a-Service, wire-compatible with ProRL-Agent-Server (see rollout_node/service/app.py).

- Its settings are run.yaml's ``service:`` section (:class:`~hpc.config.service.ServiceSection`), with
  the rest of the run config (sandboxes, tasks, rollout limits: the same as ``rollout-node``);
  ``key=value`` overrides any of them (``service.timeout_s=600``), checked like every other key. The
  flags override the section: ``--host``, ``--port``, ``--trust-network``, ``--no-auth``,
  ``--[no-]token-level``.
- ``--run RUN``: the run directory the front door and its rollout nodes share (created when missing;
  default: a fresh private one in node-local scratch). More nodes join with
  ``spoolrl rollout-server --node-only --run RUN`` on any host that sees RUN.
- When ready it prints one JSON line on stdout (``url``, ``token``, ``run``, ``token_file``) and
  writes ``RUN/endpoints/rollout-server.json`` (``url``, ``token_file``).
- ``--trust-network``: clients from these networks need no bearer token (e.g. NeMo Gym's ProRL agent,
  which sends none); every other address still does. Default: ``service.trust_network``.
  ``--no-auth`` opens every endpoint to everyone (with a warning).
- ``--token-level`` (the default): every assistant message carries ``input_ids``, ``token_ids`` and
  ``logprobs``; a request with ``sampling_params.token_level_generation: false`` gets none.
- In a Slurm step, task 0 serves (with ``service.local_nodes`` nodes) and every other task is a node.
- SIGTERM/SIGINT: stop serving, end every job, drain the nodes, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc.cli.rollout import DRAIN_SIGNALS, default_node_id
from hpc.cli.rollout import setup_logging as node_logging
from hpc.config import RunConfig, load_config
from hpc.config.service import ServiceSection, trusted_networks
from hpc.config.site import check_site
from hpc.errors import UsageError
from hpc.paths import TINY_MODEL, RunPaths, node_scratch
from hpc.records import EndpointRecord, write_endpoint
from hpc.rundir import create_run, open_run
from hpc.slurm_env import SlurmEnv

if TYPE_CHECKING:
    from rollout_node.service.node import ServiceNode

log = logging.getLogger("spoolrl.service")


def service_settings(section: ServiceSection, args: argparse.Namespace) -> ServiceSection:
    """run.yaml's ``service:`` section with the flags over it; a bad ``--trust-network`` names the flag."""
    if args.trust_network is not None:
        try:
            trusted_networks(args.trust_network)
        except ValueError as exc:
            raise UsageError(f"--trust-network: {exc}") from exc
    return replace(section, host=args.host or section.host, port=section.port if args.port is None else args.port,
                   auth=section.auth and not args.no_auth,
                   trust_network=section.trust_network if args.trust_network is None else args.trust_network,
                   token_level=section.token_level if args.token_level is None else args.token_level)


def open_or_create_run(args: argparse.Namespace, overrides: list[str]) -> tuple[RunPaths, RunConfig]:
    run = Path(args.run) if args.run else node_scratch() / f"spoolrl-raas-{os.getuid()}-{os.getpid()}"
    if (run / "run.yaml").exists() and not args.config and not overrides:
        return open_run(run)
    config = load_config(args.config, overrides)
    check_site(config)  # the server runs here: every path it names must exist here, before RUN is created
    if config.model.path == TINY_MODEL and not config.model.tokenizer_path and not (run / "model").is_dir():
        raise UsageError("rollout-server needs the policy's tokenizer: set model.path=DIR (or "
                         "model.tokenizer_path=DIR) to a Hugging Face model directory")
    return open_run(create_run(run, config, if_missing=True).root)


def setup_logging(log_dir: Path) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s rollout-server %(threadName)s %(levelname)s %(message)s")
    root = logging.getLogger("spoolrl")
    root.setLevel(logging.INFO)
    for handler in (logging.StreamHandler(sys.stderr), logging.FileHandler(log_dir / "rollout-server.log")):
        handler.setFormatter(fmt)
        root.addHandler(handler)


def run_node_only(run: str, node_id: str) -> int:
    """A rollout node for a front door on ``run`` (until SIGTERM/SIGINT/STOP)."""
    from rollout_node.service.node import build_service_node

    node = build_service_node(run, node_id)
    node_logging(node.paths.logs, node_id)
    for name in DRAIN_SIGNALS:
        signal.signal(getattr(signal, name), lambda signum, _f: node.request_drain(signal.Signals(signum).name))
    print(json.dumps(node.run(), sort_keys=True, default=str))
    return 0


def start_local_nodes(run: Path, count: int) -> list[tuple[ServiceNode, threading.Thread]]:
    from rollout_node.service.node import build_service_node

    host = socket.gethostname().split(".")[0]
    nodes = []
    for i in range(count):
        node = build_service_node(str(run), f"{host}-raas{i}")
        thread = threading.Thread(target=node.run, name=f"raas-node-{i}", daemon=True)
        thread.start()
        nodes.append((node, thread))
    return nodes


async def serve(paths: RunPaths, config: RunConfig, cfg: ServiceSection) -> None:
    from aiohttp import web

    from rollout_node.service.app import Service
    from rollout_node.service.backends import Backends
    from rollout_node.service.frontdoor import FrontDoor

    token = paths.secret.read_text().strip()
    door = FrontDoor(paths, config, timeout_s=cfg.timeout_s, poll_s=cfg.poll_s)
    runner = web.AppRunner(Service(door, Backends(paths.endpoints), cfg, token).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, backlog=4096)
    await site.start()
    port = runner.addresses[0][1]
    host = socket.gethostname() if cfg.host in ("0.0.0.0", "::") else cfg.host
    url = f"http://{host}:{port}"
    announce(paths, url, cfg, token)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    (paths.endpoints / "rollout-server.json").unlink(missing_ok=True)


def announce(paths: RunPaths, url: str, cfg: ServiceSection, token: str) -> None:
    token_file = str(paths.secret) if cfg.auth else None
    write_endpoint(paths.endpoints / "rollout-server.json",
                   EndpointRecord(url=url, host=socket.gethostname(), pid=os.getpid(), extra={"token_file": token_file}),
                   fsync=True)
    if not cfg.auth:
        log.warning("--no-auth: every endpoint is open to anyone who can reach %s", url)
    elif cfg.trust_network:
        log.info("clients from %s need no bearer token; every other address does", cfg.trust_network)
    print(json.dumps({"url": url, "token": token if cfg.auth else None, "token_file": token_file,
                      "run": str(paths.root)}), flush=True)


def _rollout_server(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    service_settings(load_config(args.config, overrides).service, args)  # bad settings fail before anything starts
    env = SlurmEnv.from_environ()
    if args.node_only or (env.in_step and env.procid > 0):
        if not args.run:
            raise UsageError("--node-only needs --run RUN (the front door's run directory)")
        return run_node_only(args.run, default_node_id())
    paths, config = open_or_create_run(args, overrides)
    cfg = service_settings(config.service, args)
    setup_logging(paths.logs)
    nodes = start_local_nodes(paths.root, cfg.local_nodes)
    try:
        asyncio.run(serve(paths, config, cfg))
    finally:
        for node, _ in nodes:
            node.request_drain("rollout-server stopped")
        for _, thread in nodes:
            thread.join(timeout=config.rollout.drain_timeout_s + 10)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("rollout-server", help="serve rollouts over HTTP (ProRL-Agent-Server compatible)",
                       description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE", help="run.yaml (omitted = built-in defaults)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="run config overrides (the server's own settings: service.<key>=value)")
    p.add_argument("--run", default="", metavar="RUN", help="run directory shared with the rollout nodes")
    p.add_argument("--host", default="", help="address to bind (default 127.0.0.1; 0.0.0.0 for other hosts)")
    p.add_argument("--port", type=int, default=None, help="TCP port (default 8006; 0 = any free port)")
    p.add_argument("--trust-network", default=None, metavar="CIDR[,CIDR...]",
                   help="clients from these networks need no bearer token; others still do "
                        "(default: service.trust_network)")
    p.add_argument("--no-auth", action="store_true", help="serve without the bearer token to everyone (warns)")
    p.add_argument("--token-level", action=argparse.BooleanOptionalAction, default=None,
                   help="token IDs and logprobs on every assistant message (default: on; a request's "
                        "sampling_params.token_level_generation: false turns them off for it)")
    p.add_argument("--node-only", action="store_true", help="be one more rollout node of the front door on --run")
    p.set_defaults(func=_rollout_server)
