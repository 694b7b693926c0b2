"""Rank 0's batch source: polls the spool and prepares the next batch while a step trains.

Guarantees:
- With ``prefetch`` a background thread keeps at most one batch ready; without it the batch is
  built on demand. Both give the same batches in the same order (the consumer is deterministic
  and the thread only runs ahead by one).
- ``get`` reports the seconds the caller waited (the trainer's idle time).
- All consumer access goes through ``consumer.lock``, so a checkpoint sees a consistent state.
- Batches are filtered at the version that will train them: ``version(outstanding)`` is asked with
  ``outstanding`` True while a batch handed out by ``get`` has not finished its step
  (:meth:`step_finished`), since a batch built then trains after that step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from train_node.trainer.consumer import Batch, Consumer


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
