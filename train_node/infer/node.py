"""``spoolrl infer-node RUN``: run, advertise, reload and restart one node's inference servers.

What it does (torch-free; the CPU engine runs in child processes):
- engine 'cpu': ``inference.num_cpu_servers`` CPU engines; engine 'vllm': GPUs / tensor_parallel
  vLLM servers, each with its own ``CUDA_VISIBLE_DEVICES`` slice, behind its own proxy.
- Starts every server on the newest published policy (``RUN/policy/LATEST``), else the run's
  initial model (version 0).
- Advertises each healthy server in ``RUN/endpoints/infer-<host>-<i>.json`` (atomic writes):
  ``{"url", "version", "heartbeat", "role": "infer", "engine", "host", "index", "pid", "server_pid",
  "model", "loading"}`` (``pid``: the infer-node; ``model``: the served model name; ``loading``: the
  version a reload in progress reads, else null); while a server starts, ``loading-<host>-<i>.json``
  names the version it loads (:mod:`train_node.infer.pins`: the trainer's retention keeps both);
  the heartbeat counter grows every ``heartbeat_s`` while the server answers ``/health``. A server
  that is down has no endpoint file.
- Watches ``RUN/policy/LATEST`` and pushes each new version into every running server (in
  parallel) through the :mod:`~train_node.infer.weights` seam; the endpoint file's ``version``
  changes only after the server confirmed the swap. After a failed reload it is the version the
  server reports it serves (``served_version``); a server that cannot say is restarted.
- Restarts a server whose process died, that did not become healthy within
  ``server_start_timeout_s``, or that failed 3 health checks in a row; gives up (exit 1) after
  ``max_restarts`` restarts in a row that never became healthy, unless the node is asked to stop within
  ``STEP_SIGNAL_GAP_S`` of the last failure (Slurm signals a step deepest first: a server can die of the
  job's SIGTERM, or stop answering, up to ~1 s before the node hears it; that is a stop, not a failure).
- SIGTERM/SIGINT or ``RUN/control/STOP``: keeps serving (supervision, heartbeats, reloads) while rollout
  nodes are present (``RUN/endpoints/rollout-node-*.json``, :mod:`hpc.rollout_presence`: a node removes
  its record once its drain released everything), at most ``rollout.drain_timeout_s`` +
  ``DRAIN_MARGIN_S``; then stops all servers, removes its endpoint files, exits 0. SIGUSR1 (Slurm's
  time-limit warning) is ignored: draining rollout nodes still need answers until SIGTERM.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Protocol

from hpc import rollout_presence
from hpc.config import RunConfig
from hpc.errors import InferenceError, RunDirError, UsageError
from hpc.metrics import MetricsWriter
from hpc.paths import RunPaths
from hpc.records import EndpointRecord, write_endpoint
from hpc.rundir import open_run
from hpc.slurm_env import SlurmEnv
from train_node.infer.pins import loading_pin
from train_node.infer.servers import SERVED_MODEL_NAME, CpuServer, ServerSpec, VllmServer
from train_node.infer.weights import DiskReload, PolicyRef, RunDirPolicySource, WeightTransport

UNHEALTHY_CHECKS = 3
STEP_SIGNAL_GAP_S = 3.0  # how long a give-up waits for a stop that may be on its way (see the docstring)


class Server(Protocol):
    engine: str

    def start(self, model: Path, version: int) -> None: ...
    def alive(self) -> bool: ...
    def healthy(self) -> bool: ...
    @property
    def url(self) -> str | None: ...
    @property
    def pid(self) -> int | None: ...
    def reload(self, path: Path, version: int) -> None: ...
    def served_version(self) -> int | None: ...
    def stop(self) -> None: ...


@dataclasses.dataclass
class Slot:
    """Supervision state of one server."""

    index: int
    server: Server
    endpoint: Path
    pin: Path  # loading-<host>-<i>.json while the server starts (see train_node.infer.pins)
    up: bool = False
    version: int = 0
    loading: int | None = None
    started_at: float = 0.0
    heartbeat: int = 0
    restarts: int = 0
    bad_checks: int = 0
    restart_at: float = 0.0
    push_after: float = 0.0
    pushing: bool = False
    doubt: str = ""  # set by a failed push whose server cannot say what it serves


def interface_address(name: str) -> str:
    """IPv4 address of a network interface (SIOCGIFADDR), e.g. the cluster's high-speed network."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
        except OSError as exc:
            raise UsageError(f"inference.interface: no IPv4 address on interface {name!r} ({exc.strerror}); "
                             "check 'ip -4 addr' on the inference nodes") from exc
    return socket.inet_ntoa(packed[20:24])


def visible_gpus(configured: int) -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip():
        return [g for g in env.split(",") if g.strip()]
    return [str(i) for i in range(configured)]


def build_specs(cfg: RunConfig, paths: RunPaths, host: str, node_index: int) -> list[ServerSpec]:
    inf = cfg.inference
    advertise = interface_address(inf.interface) if inf.interface else host
    bind = advertise if inf.interface else "0.0.0.0"
    if inf.engine == "vllm":
        gpus = visible_gpus(cfg.slurm.infer.gpus_per_node)
        slices = [tuple(gpus[i:i + inf.tensor_parallel]) for i in range(0, len(gpus), inf.tensor_parallel)]
        slices = [s for s in slices if len(s) == inf.tensor_parallel] or [()]  # () = one CPU vLLM server
    else:
        slices = [()] * inf.num_cpu_servers
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    specs = []
    for i, gpu_slice in enumerate(slices):
        n = node_index * len(slices) + i
        specs.append(ServerSpec(
            index=n, bind_host=bind, advertise_host=advertise, port=inf.port_base + i if inf.port_base else 0,
            secret_file=paths.secret, log_path=paths.logs / f"infer-{host}-{n}.log",
            require_auth_all=inf.require_auth_all, request_timeout_s=max(inf.request_timeout_s, 600.0),
            dtype=inf.dtype, max_model_len=inf.max_model_len,
            threads=inf.cpu_threads or max(1, ncpu // len(slices)), max_batch=inf.cpu_max_batch,
            prefix_cache_mb=inf.cpu_prefix_cache_mb,
            vllm_python=inf.vllm_python, vllm_args=tuple(inf.vllm_args), tensor_parallel=inf.tensor_parallel,
            gpus=gpu_slice, cpu_kvcache_gb=inf.vllm_cpu_kvcache_gb))
    return specs


def initial_model(cfg: RunConfig, paths: RunPaths) -> Path:
    model = paths.model_dir(cfg.model.path)
    if not (model / "config.json").exists():
        raise RunDirError(f"initial model {model} has no config.json; 'spoolrl init' builds the tiny model, "
                          "or set model.path to an HF checkpoint directory")
    return model


class InferNode:
    def __init__(self, paths: RunPaths, cfg: RunConfig, servers: dict[int, Server], *, host: str,
                 process_name: str, transport: WeightTransport | None = None) -> None:
        """``servers``: global server index -> server (the index names its endpoint file)."""
        self.paths, self.cfg, self.host = paths, cfg, host
        self.slots = [Slot(i, s, paths.endpoints / f"infer-{host}-{i}.json", loading_pin(paths.endpoints, host, i))
                      for i, s in servers.items()]
        self.source = RunDirPolicySource(paths.root)
        self.transport = transport or DiskReload()
        self.metrics = MetricsWriter(paths.root, process_name)
        self.stop = threading.Event()
        self._write_lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(servers)))
        self._next_beat = self._next_poll = 0.0
        self._give_up: tuple[float, str] | None = None  # (when, why): exit 1 then unless stopping by then

    def current_policy(self) -> PolicyRef:
        return self.source.latest() or PolicyRef(0, initial_model(self.cfg, self.paths))

    def run(self) -> int:
        self.paths.endpoints.mkdir(parents=True, exist_ok=True)
        try:
            for slot in self.slots:
                self._start(slot)
            self._serve(lambda: not self.stop.is_set() and not self.paths.stop_marker.exists())
            self._serve_drain()
        finally:
            self.shutdown()
        return 0

    def _serve(self, keep_going: Callable[[], bool]) -> None:
        """Supervise, heartbeat and reload every 0.2 s while ``keep_going()``."""
        inf = self.cfg.inference
        while keep_going():
            now = time.monotonic()
            for slot in self.slots:
                self._supervise(slot, now)
            if self._give_up is not None and now >= self._give_up[0] and not self._stopping():
                raise InferenceError(self._give_up[1])
            if now >= self._next_beat:
                self._heartbeat()
                self._next_beat = now + inf.heartbeat_s
            if now >= self._next_poll:
                self._push_latest()
                self._next_poll = now + inf.policy_poll_s
            time.sleep(0.2)

    def _stopping(self) -> bool:
        return self.stop.is_set() or self.paths.stop_marker.exists()

    def _serve_drain(self) -> None:
        """Asked to stop: go on serving while rollout nodes drain (bounded), so their episodes get answers."""
        bound = self.cfg.rollout.drain_timeout_s + rollout_presence.DRAIN_MARGIN_S
        deadline = time.monotonic() + bound
        waiting = rollout_presence.present(self.paths)
        if not waiting:
            return
        self.metrics.log("drain_wait", rollout_nodes=[r.worker_id for r in waiting], bound_s=bound)
        self._serve(lambda: time.monotonic() < deadline and bool(rollout_presence.present(self.paths)))
        left = [r.worker_id for r in rollout_presence.present(self.paths)]
        self.metrics.log("drain_done", still_present=left, waited_s=round(bound - (deadline - time.monotonic()), 2))

    # --- supervision -------------------------------------------------------------------------------

    def _start(self, slot: Slot) -> None:
        ref = self.current_policy()
        write_endpoint(slot.pin, EndpointRecord(role="loading", loading=ref.version, host=self.host, pid=os.getpid(),
                                                extra={"index": slot.index}))
        slot.server.start(ref.path, ref.version)
        slot.version, slot.up, slot.bad_checks = ref.version, False, 0
        slot.started_at = time.monotonic()
        self.metrics.log("server_start", index=slot.index, engine=slot.server.engine, version=ref.version)

    def _supervise(self, slot: Slot, now: float) -> None:
        inf = self.cfg.inference
        if slot.restart_at:
            if now >= slot.restart_at:
                slot.restart_at = 0.0
                self._start(slot)
            return
        if not slot.server.alive():
            return self._down(slot, "process exited")
        if slot.doubt:
            reason, slot.doubt = slot.doubt, ""
            return self._down(slot, reason)
        if not slot.up:
            if slot.server.healthy():
                slot.up, slot.restarts = True, 0
                self.metrics.log("server_up", index=slot.index, url=slot.server.url, version=slot.version,
                                 start_s=round(now - slot.started_at, 2))
                self._advertise(slot)
                slot.pin.unlink(missing_ok=True)
            elif now - slot.started_at > inf.server_start_timeout_s:
                self._down(slot, f"not healthy after {inf.server_start_timeout_s:g} s")

    def _down(self, slot: Slot, reason: str) -> None:
        with self._write_lock:
            slot.up = False
            slot.endpoint.unlink(missing_ok=True)
        slot.server.stop()
        slot.pin.unlink(missing_ok=True)
        slot.restarts += 1
        self.metrics.log("server_down", index=slot.index, reason=reason, restarts=slot.restarts)
        if slot.restarts > self.cfg.inference.max_restarts:
            slot.restart_at = math.inf  # no more restarts; the node ends unless a stop arrives meanwhile
            self._give_up = self._give_up or (
                time.monotonic() + STEP_SIGNAL_GAP_S,
                f"inference server {slot.index} on {self.host} failed {slot.restarts} times in a row (last: {reason}); "
                f"see {self.paths.logs}/infer-{self.host}-*.log")
            return
        slot.restart_at = time.monotonic() + min(2.0 ** slot.restarts, 30.0)

    def _heartbeat(self) -> None:
        for slot in self.slots:
            if not slot.up:
                continue
            if slot.server.healthy():
                slot.bad_checks = 0
                slot.heartbeat += 1
                self._advertise(slot)
            else:
                slot.bad_checks += 1
                if slot.bad_checks >= UNHEALTHY_CHECKS:
                    self._down(slot, f"{UNHEALTHY_CHECKS} failed health checks")

    def _advertise(self, slot: Slot) -> None:
        with self._write_lock:  # the heartbeat and a finished push may write the same file
            self._write_endpoint(slot)

    def _write_endpoint(self, slot: Slot) -> None:
        if not slot.up:
            return  # a push that finished after the server went down must not resurrect its file
        write_endpoint(slot.endpoint, EndpointRecord(
            role="infer", url=slot.server.url, version=slot.version, heartbeat=slot.heartbeat, loading=slot.loading,
            host=self.host, pid=os.getpid(),
            extra={"engine": slot.server.engine, "index": slot.index, "model": SERVED_MODEL_NAME,
                   "server_pid": slot.server.pid}))

    # --- policy updates ----------------------------------------------------------------------------

    def _push_latest(self) -> None:
        ref = self.source.latest()
        if ref is None:
            return
        now = time.monotonic()
        for slot in self.slots:
            if slot.up and not slot.pushing and slot.version < ref.version and now >= slot.push_after:
                slot.pushing = True  # pushes run in the background: heartbeats must go on meanwhile
                self._pool.submit(self._push, slot, ref)

    def _push(self, slot: Slot, ref: PolicyRef) -> None:
        t0 = time.monotonic()
        slot.loading = ref.version
        self._advertise(slot)  # retention keeps the version being read (and the one served) on disk
        try:
            self.transport.push(slot.server, ref)
        except Exception as exc:
            slot.push_after = time.monotonic() + 5 * self.cfg.inference.policy_poll_s
            self._after_failed_push(slot, ref, exc)
            return
        finally:
            slot.pushing, slot.loading = False, None
        slot.version = ref.version
        self._advertise(slot)
        self.metrics.log("reload", index=slot.index, version=ref.version, seconds=round(time.monotonic() - t0, 3))

    def _after_failed_push(self, slot: Slot, ref: PolicyRef, exc: Exception) -> None:
        """Advertise the version the server reports it serves; a server that cannot say is restarted."""
        actual = slot.server.served_version()
        self.metrics.log("reload_failed", index=slot.index, version=ref.version, serving=actual,
                         error=str(exc)[:500])
        if actual is None:  # the supervision loop restarts it (pushes run on pool threads)
            slot.doubt = f"weights unknown after a failed reload to version {ref.version}"
            return
        slot.version, slot.loading = actual, None
        self._advertise(slot)

    def shutdown(self) -> None:
        with self._write_lock:
            for slot in self.slots:
                slot.up = False
                slot.endpoint.unlink(missing_ok=True)
        for slot in self.slots:
            slot.server.stop()
            slot.pin.unlink(missing_ok=True)
        self._pool.shutdown(wait=False)
        self.metrics.log("node_stop")


def make_servers(specs: list[ServerSpec], engine: str) -> dict[int, Server]:
    return {s.index: VllmServer(s) if engine == "vllm" else CpuServer(s) for s in specs}


def run_infer_node(run_dir: str, node_index: int | None = None) -> int:
    paths, cfg = open_run(run_dir)
    if not paths.secret.exists():
        raise RunDirError(f"{paths.secret} is missing; 'spoolrl init' creates the run secret")
    host = socket.gethostname().split(".")[0]
    index = node_index if node_index is not None else SlurmEnv.from_environ().node_index
    specs = build_specs(cfg, paths, host, index)
    node = InferNode(paths, cfg, make_servers(specs, cfg.inference.engine), host=host,
                     process_name=f"infer-{host}-{index}")

    def on_signal(signum: int, frame: FrameType | None) -> None:
        node.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Slurm's time-limit warning (--signal=USR1@drain_s) reaches every process of the step: the rollout
    # group is draining and needs its episodes answered, so servers keep serving until SIGTERM.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    return node.run()
