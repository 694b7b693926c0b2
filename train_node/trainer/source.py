"""Rank 0's batch source: polls the spool and prepares the next batch while a step trains.

Guarantees:
- With ``prefetch`` a background thread keeps at most one batch ready; without it the batch is
  built on demand. Both give the same batches in the same order (the consumer is deterministic
  and the thread only runs ahead by one).
- ``get`` reports the seconds the caller waited (the trainer's idle time).
- All consumer access goes through ``consumer.lock``, so a checkpoint sees a consistent state.
- :class:`WaitSignal`: while the trainer waits for a batch, ``control/TRAINER_WAITING`` says so, and
  rollout nodes seal their open shards at once (the step's last groups do not sit out
  ``spool.shard_max_age_s``).
- Batches are filtered at the version that will train them: ``version(outstanding)`` is asked with
  ``outstanding`` True while a batch handed out by ``get`` has not finished its step
  (:meth:`step_finished`), since a batch built then trains after that step.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from hpc.paths import RunPaths
from hpc.records import TrainerWaiting, clear_trainer_waiting, write_trainer_waiting
from train_node.trainer.consumer import Batch, Consumer

log = logging.getLogger("spoolrl.trainer")


class BatchSource:
    def __init__(self, consumer: Consumer, num_groups: int, version: Callable[[bool], int], *, prefetch: bool,
                 poll_interval_s: float, draining: Callable[[], bool]) -> None:
        self.consumer = consumer
        self.num_groups = num_groups
        self.version = version
        self.prefetch = prefetch
        self.poll_interval_s = poll_interval_s
        self.draining = draining
        self._ready: Batch | None = None
        self._outstanding = False  # a batch was handed out and its step has not finished
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        if prefetch:
            self._thread = threading.Thread(target=self._loop, name="batch-prefetch", daemon=True)
            self._thread.start()

    def _try_build(self) -> Batch | None:
        """One attempt: build from the buffer, else claim shards and try again (caller holds the lock)."""
        version = self.version(self._outstanding)
        batch = self.consumer.next_batch(version, self.num_groups)
        if batch is None and self.consumer.poll():
            batch = self.consumer.next_batch(version, self.num_groups)
        if batch is None and self.draining():
            batch = self.consumer.next_batch(version, self.num_groups, allow_partial=True)
        return batch

    def step_finished(self) -> None:
        """The step of the batch last handed out is over (its weights are published, if it publishes)."""
        self._outstanding = False

    def _loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while self._ready is not None and not self._stop:
                        self._cv.wait()
                    if self._stop:
                        return
                with self.consumer.lock:  # a drain check never sees a batch between buffer and slot
                    batch = self._try_build()
                    if batch is not None:
                        with self._cv:
                            self._ready = batch
                            self._cv.notify_all()
                if batch is None:
                    time.sleep(self.poll_interval_s)
        except BaseException as exc:  # surfaced by get()
            with self._cv:
                self.error = exc
                self._cv.notify_all()

    def get(self, timeout_s: float) -> tuple[Batch | None, float]:
        """(batch or None after ``timeout_s``, seconds waited)."""
        t0 = time.perf_counter()
        if not self.prefetch:
            deadline = t0 + timeout_s
            while True:
                with self.consumer.lock:
                    batch = self._try_build()
                    self._outstanding = batch is not None
                if batch is not None or time.perf_counter() >= deadline:
                    return batch, time.perf_counter() - t0
                time.sleep(self.poll_interval_s)
        with self._cv:
            self._cv.wait_for(lambda: self._ready is not None or self.error is not None, timeout=timeout_s)
            if self.error is not None:
                raise self.error
            batch, self._ready = self._ready, None
            if batch is not None:
                self._outstanding = True  # before the prefetch thread wakes up to build the next one
            self._cv.notify_all()
        return batch, time.perf_counter() - t0

    def has_ready(self) -> bool:
        with self._cv:
            return self._ready is not None

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)


class WaitSignal:
    """``control/TRAINER_WAITING`` (:class:`hpc.records.TrainerWaiting`) while the trainer waits for a batch:
    written once when a wait begins (however many idle rounds it lasts), removed when a batch is handed out and
    when the trainer closes. One left by a trainer that died is removed when the next one starts; until then the
    nodes seal every group at once, which costs shards, not correctness. A failed write is logged: the nodes then
    seal by age, as without the signal."""

    def __init__(self, paths: RunPaths, generation: int) -> None:
        self.paths, self.generation = paths, generation
        self.on = False
        with contextlib.suppress(OSError):
            clear_trainer_waiting(paths)  # a dead predecessor's

    def begin(self, step: int, policy_version: int) -> None:
        """The trainer is blocked waiting for the samples of ``step`` (trained at ``policy_version``)."""
        if self.on:
            return
        record = TrainerWaiting(step=step, policy_version=policy_version, generation=self.generation, since=time.time())
        try:
            write_trainer_waiting(self.paths, record)
        except OSError as exc:
            log.warning("cannot write %s (%s): rollout nodes seal their shards by age", self.paths.trainer_waiting, exc)
            return
        self.on = True

    def end(self) -> None:
        """The wait is over (a batch came, or the trainer stops)."""
        if self.on:
            self.on = False
            with contextlib.suppress(OSError):
                clear_trainer_waiting(self.paths)
