"""The ``/process`` client beside the run: one call at a time against the rollout-server, written from
the wire format alone (no spoolrl client code), so a broken answer cannot be hidden by shared code.

Guarantees: every call's outcome is recorded once: ``result:<status>``, ``error:<http code>`` (a named
failure: the body says why), ``dropped:<exception>`` (the connection dropped and the rollout-server that
took the call went away: SIGKILLed, stopped with the whole run, or replaced) or ``hung`` (no answer within
``service.timeout_s`` + 60 s); ``unnamed:<code>`` marks an error without a reason and
``unnamed:dropped:<exception>`` a connection dropped while that server lived on (failed checks).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc.errors import RecordError
from hpc.records import read_endpoint
from scripts.chaos.observe import infer_servers
from scripts.chaos.procs import now

if TYPE_CHECKING:
    from scripts.chaos.harness import Harness

SERVICE_TIMEOUT_S = 120
DROP_WAIT_S = 5.0  # a killed server is marked killed before its signal; a replaced one shows a new incarnation
STOP_DROP_WAIT_S = 65.0  # during the whole-run stop the server exits within its SIGTERM grace (harness.STOP_GRACE_S)
PROCESS_INSTANCE = "spoolrl__intervals-1"


class ProcessClient:
    def __init__(self, harness: Harness, instance: dict[str, Any]) -> None:
        self.harness, self.instance = harness, instance
        self.outcomes: dict[str, list[str]] = {}
        self.in_flight = False
        self.stopping = threading.Event()
        self.backend: tuple[float, str] | None = None
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        n = 0
        while not self.stopping.is_set():
            server = self.server()
            if server is None or self.harness.paused or not self.ensure_backend(*server):
                time.sleep(1.0)
                continue
            n += 1
            job = f"soak-{n}"
            body = {"instance": self.instance, "job_id": job, "sampling_params": {"max_iterations": 2}}
            incarnation = self.harness.roles["raas"].starts
            self.in_flight = True
            outcome = self.call(*server, body)
            self.in_flight = False
            if outcome.startswith("dropped:"):
                outcome = attributed_drop(outcome, self.server_went_away(incarnation))
            self.outcomes.setdefault(job, []).append(outcome)
            if not outcome.startswith("result:"):
                time.sleep(2.0)  # a client backs off after a failure (and a killed server needs a moment)

    def call(self, url: str, token: str, body: dict[str, Any]) -> str:
        try:
            code, answer = http(url, "/process", body, token, SERVICE_TIMEOUT_S + 60.0)
        except TimeoutError:
            return "hung"
        except urllib.error.URLError as exc:
            return "hung" if isinstance(exc.reason, TimeoutError) else f"dropped:{type(exc.reason).__name__}"
        except (OSError, ValueError) as exc:
            return f"dropped:{type(exc).__name__}"
        if code == 200 and isinstance(answer, dict) and "status" in answer:
            return f"result:{answer['status']}"
        named = isinstance(answer, dict) and any(answer.get(k) for k in ("detail", "error", "message"))
        return f"error:{code}" if named else f"unnamed:{code}"

    def server_went_away(self, incarnation: int) -> bool:
        """The rollout-server incarnation that took the call was killed, has exited or was replaced (waiting a
        little, and through the whole-run stop's grace while the run stops)."""
        role = self.harness.roles["raas"]
        deadline = now() + (STOP_DROP_WAIT_S if self.harness.paused else DROP_WAIT_S)
        while role.starts == incarnation and not role.killed and role.alive():
            if now() >= deadline:
                return False
            time.sleep(0.2)
        return True

    def server(self) -> tuple[str, str] | None:
        """(url, token) of the current rollout-server incarnation, once it announced itself."""
        role = self.harness.roles["raas"]
        record = self.harness.raas / "endpoints" / "rollout-server.json"
        try:
            if not role.alive() or record.stat().st_mtime < time.time() - (now() - role.started):
                return None
            rec = read_endpoint(record)
            token_file = rec.extra.get("token_file") if rec else None
            if rec is None or rec.url is None or not isinstance(token_file, str):
                return None
            return rec.url, Path(token_file).read_text().strip()
        except (OSError, RecordError):
            return None

    def ensure_backend(self, url: str, token: str) -> bool:
        """Point the rollout-server at the inference server now announced (a restart changes its port)."""
        urls = [s.url for s in infer_servers(self.harness.run) if s.url]
        if not urls:
            return False
        want = (self.harness.roles["raas"].started, urls[0])
        if self.backend == want:
            return True
        try:
            if self.backend is None or self.backend[0] != want[0]:
                http(url, "/start", {}, token, 30.0)  # a new incarnation starts stopped (400: already running)
            http(url, "/clear_llm_server", {}, token, 30.0)
            code, _ = http(url, "/add_llm_server", {"address": want[1] + "/v1"}, token, 30.0)
        except (OSError, ValueError):
            return False
        self.backend = want if code == 200 else None
        return code == 200


def attributed_drop(outcome: str, server_went_away: bool) -> str:
    """A dropped connection is a named failure (the server's death) only if the server that took the call went
    away; a drop from a server that lived on is a failure without a reason."""
    return outcome if server_went_away else f"unnamed:{outcome}"


def http(url: str, path: str, body: Any, token: str, timeout_s: float) -> tuple[int, Any]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")
