"""Handles on one inference server process each: the CPU engine or vLLM behind its proxy (torch-free).

Both handles expose the same small surface to the node supervisor: ``start(model, version)``,
``alive()``, ``healthy()``, ``url``, ``reload(path, version)``, ``served_version()`` (what the
server itself says it serves, None if it cannot say), ``stop()``.

Guarantees:
- Each server runs in its own session (process group); ``stop`` sends SIGTERM to the whole group,
  then SIGKILL after a grace period, so no worker process outlives its handle.
- A server does not outlive its node process either: it starts under ``setpriv --pdeathsig TERM``
  (util-linux >= 2.33), so the kernel sends it SIGTERM when the thread that started it (the node's
  supervision loop) dies, SIGKILL included. Where setpriv lacks the option the server starts bare
  (outside Slurm an orphaned server then runs on; inside a job Slurm's step cleanup still ends it).
- vLLM listens only on a Unix socket inside a fresh 0700 directory on node-local scratch, so the
  authenticating proxy (which this handle runs in-process) is the only way to reach it. Its
  development endpoints (``VLLM_SERVER_DEV_MODE=1``) are therefore reachable only with the secret.
  vLLM's own temporary files and ZeroMQ sockets go to the same directory (``TMPDIR``,
  ``VLLM_RPC_BASE_PATH``), which ``stop`` removes however vLLM ended (killed included); only a node
  process that dies without running ``stop`` leaves it (and the CPU engine's) behind.
- ``healthy()`` is True only after the model loaded (and, for vLLM, after the weights got their
  integer version label); ``url`` is the advertised address clients should use.
"""

from __future__ import annotations

import dataclasses
import functools
import getpass
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from hpc.config.inference import CPU_MAX_BATCH, CPU_PREFIX_CACHE_MB
from hpc.fsutil import read_json
from hpc.httpserver import HttpServer
from hpc.paths import node_scratch
from train_node.infer.httpbase import route_app
from train_node.infer.protocol import LOGPROBS_MODE
from train_node.infer.proxy import Upstream, VllmProxy, make_proxy_handler

SERVED_MODEL_NAME = "policy"


@dataclasses.dataclass(frozen=True)
class ServerSpec:
    """Everything one server needs besides the weights."""

    index: int
    bind_host: str
    advertise_host: str
    port: int  # 0 = any free port
    secret_file: Path
    log_path: Path
    require_auth_all: bool = False
    request_timeout_s: float = 3600.0
    dtype: str = "auto"
    max_model_len: int = 0
    # cpu engine
    threads: int = 0
    max_batch: int = CPU_MAX_BATCH
    prefix_cache_mb: int = CPU_PREFIX_CACHE_MB
    # vllm
    vllm_python: str = "python3"
    vllm_args: tuple[str, ...] = ()
    tensor_parallel: int = 1
    gpus: tuple[str, ...] = ()
    cpu_kvcache_gb: int = 1


@functools.cache
def _tether() -> tuple[str, ...]:
    """The command prefix that gives a child SIGTERM when its parent dies (() where unsupported)."""
    setpriv = shutil.which("setpriv")
    if not setpriv:
        return ()
    try:
        ok = subprocess.run([setpriv, "--pdeathsig", "TERM", "--", "true"], capture_output=True,
                            timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return (setpriv, "--pdeathsig", "TERM", "--") if ok else ()


class _Process:
    """A child process in its own session, logging to a file, ended by the kernel if its parent dies."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def spawn(self, cmd: list[str], env: dict[str, str], log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self._log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} start: {' '.join(cmd)}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen([*_tether(), *cmd], stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self, grace_s: float = 15.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        elif self.proc is not None:
            _signal_group(self.proc.pid, signal.SIGKILL)  # the leader died; reap any orphaned workers
        if self._log is not None:
            self._log.close()
            self._log = None


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# the longest name a server puts in its private directory: vLLM's ZeroMQ sockets are named by a uuid4 (36)
_LONGEST_NAME = 36


def _private_dir(prefix: str) -> Path:
    """A fresh 0700 directory on node-local scratch, short enough for a Unix socket path in it."""
    base = node_scratch()
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    if len(str(path)) + 1 + _LONGEST_NAME > 107:  # sun_path holds 108 bytes with the NUL
        shutil.rmtree(path, ignore_errors=True)
        path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    return path


class CpuServer:
    """``spoolrl serve`` in a child process (TCP on the bind host)."""

    engine = "cpu"

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self._proc = _Process()
        self._dir: Path | None = None
        self._local_url: str | None = None

    def start(self, model: Path, version: int) -> None:
        self._dir = _private_dir("spoolrl-cpu-")
        s = self.spec
        cmd = [sys.executable, "-m", "hpc.cli", "serve", "--model", str(model), "--host", s.bind_host,
               "--port", str(s.port), "--version", str(version), "--served-model-name", SERVED_MODEL_NAME,
               "--dtype", "float32" if s.dtype == "auto" else s.dtype, "--threads", str(s.threads),
               "--max-batch", str(s.max_batch), "--prefix-cache-mb", str(s.prefix_cache_mb), "--secret-file", str(s.secret_file),
               "--ready-file", str(self._dir / "ready.json"), "--max-model-len", str(s.max_model_len)]
        if s.require_auth_all:
            cmd.append("--require-auth-all")
        self._local_url = None
        self._proc.spawn(cmd, dict(os.environ), s.log_path)

    def alive(self) -> bool:
        return self._proc.alive()

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def healthy(self) -> bool:
        if self._local_url is None:
            ready = self._dir / "ready.json" if self._dir else None
            if ready is None or not ready.exists():
                return False
            self._local_url = str(read_json(ready)["url"])
        return Upstream(self._local_url).healthy()

    @property
    def url(self) -> str | None:
        if self._local_url is None:
            return None
        port = self._local_url.rsplit(":", 1)[1]
        return f"http://{self.spec.advertise_host}:{port}"

    def reload(self, path: Path, version: int) -> None:
        assert self._local_url is not None
        secret = self.spec.secret_file.read_text().strip()
        up = Upstream(self._local_url)
        status, data = up.call("POST", "/reload", {"path": str(path), "version": version},
                               timeout=self.spec.request_timeout_s, headers={"Authorization": f"Bearer {secret}"})
        if status != 200:
            raise RuntimeError(f"reload to version {version} failed ({status}): {data[:300]!r}")

    def served_version(self) -> int | None:
        """The version the engine serves (its ``/weight_info``), None if it does not answer."""
        if self._local_url is None:
            return None
        secret = self.spec.secret_file.read_text().strip()
        try:
            status, data = Upstream(self._local_url).call("GET", "/weight_info", timeout=30.0,
                                                          headers={"Authorization": f"Bearer {secret}"})
            return int(json.loads(data)["version"]) if status == 200 else None
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def stop(self) -> None:
        self._proc.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


class VllmServer:
    """A vLLM OpenAI server on a private Unix socket + this process's authenticating proxy on TCP."""

    engine = "vllm"

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self._proc = _Process()
        self._dir: Path | None = None
        self._proxy: VllmProxy | None = None
        self._http: HttpServer | None = None

    def command(self, model: Path, sock: Path) -> list[str]:
        s = self.spec
        cmd = [s.vllm_python, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(model),
               "--served-model-name", SERVED_MODEL_NAME, "--uds", str(sock), "--generation-config", "vllm",
               "--enable-scale-out", "--max-logprobs", "20", "--logprobs-mode", LOGPROBS_MODE, "--tensor-parallel-size", str(s.tensor_parallel)]
        if s.dtype != "auto":
            cmd += ["--dtype", s.dtype]
        if s.max_model_len:
            cmd += ["--max-model-len", str(s.max_model_len)]
        if not s.gpus and "--enforce-eager" not in s.vllm_args:
            cmd.append("--enforce-eager")  # on CPU compiling costs 20+ s of start and gains nothing
        return cmd + list(s.vllm_args)

    def environment(self, private: Path) -> dict[str, str]:
        """vLLM's environment. Its temporary files (the CPU backend's ``vllm_dist_*`` file store) and its
        ZeroMQ sockets go to ``private``, the server's own directory, which :meth:`stop` removes even when vLLM
        was killed; torch's compile cache stays where it was (it outlives the server on purpose)."""
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no name for this uid: torch's own default would fail the same way
            user = str(os.getuid())
        inductor = Path(tempfile.gettempdir()) / f"torchinductor_{user}"
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", TMPDIR=str(private), VLLM_RPC_BASE_PATH=str(private))
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(inductor))
        if self.spec.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.spec.gpus)
        else:
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.spec.cpu_kvcache_gb))
        return env

    def start(self, model: Path, version: int) -> None:
        self._dir = _private_dir("spoolrl-vllm-")
        sock = self._dir / "vllm.sock"
        secret = self.spec.secret_file.read_text().strip()
        self._proxy = VllmProxy(Upstream(f"unix://{sock}"), secret=secret, version=version, path=str(model),
                                served_model_name=SERVED_MODEL_NAME, require_auth_all=self.spec.require_auth_all,
                                request_timeout_s=self.spec.request_timeout_s)
        self._http = HttpServer(route_app(make_proxy_handler(self._proxy)), host=self.spec.bind_host,
                                port=self.spec.port).start()
        self._proc.spawn(self.command(model, sock), self.environment(self._dir), self.spec.log_path)

    def alive(self) -> bool:
        return self._proc.alive()

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def healthy(self) -> bool:
        proxy = self._proxy
        if proxy is None:
            return False
        if not proxy.ready:
            if not proxy.upstream.healthy():
                return False
            proxy.start()
        return proxy.healthy()

    @property
    def url(self) -> str | None:
        if self._http is None:
            return None
        return f"http://{self.spec.advertise_host}:{self._http.port}"

    def reload(self, path: Path, version: int) -> None:
        assert self._proxy is not None
        self._proxy.reload(str(path), version)

    def served_version(self) -> int | None:
        """The proxy's version (restored after a failed reload), None when the weights are in doubt."""
        proxy = self._proxy
        return proxy.version if proxy is not None and proxy.broken is None else None

    def stop(self) -> None:
        self._proc.stop()
        if self._http is not None:
            self._http.close()
            self._http = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
