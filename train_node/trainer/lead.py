"""Rank 0's own state in the train loop (:class:`Lead`): the spool face, what is consumed and fed,
publishing and metrics. Only rank 0 builds one (``Trainer._setup_rank0``); the other ranks hold
none, so rank-0-only code reaches it through ``Trainer.lead``, which raises elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc.metrics import MetricsWriter
from hpc.spool import ConsumerSpool
from train_node.trainer.consumer import Batch, Consumer
from train_node.trainer.feeder import Feeder
from train_node.trainer.packing import Plan
from train_node.trainer.publish import Publisher
from train_node.trainer.source import BatchSource, WaitSignal


@dataclass
class Lead:
    """Rank 0's own state: the spool, what is consumed and fed, publishing and metrics. The other
    ranks hold none of it (``Trainer.lead`` raises there)."""

    spool: ConsumerSpool
    generation: int  # this trainer's fencing generation
    consumer: Consumer
    feeder: Feeder | None
    publisher: Publisher
    metrics: MetricsWriter
    waiting: WaitSignal  # control/TRAINER_WAITING while a wait for a batch lasts
    source: BatchSource | None = None  # started once the initial weights are published
    pending: tuple[Batch, list[Plan], float] | None = None  # the running step's batch, plans, wait

    @property
    def batches(self) -> BatchSource:
        if self.source is None:
            raise RuntimeError("the batch source starts after the initial publish (Trainer.setup)")
        return self.source

    def handed_out(self) -> tuple[Batch, list[Plan], float]:
        """The batch of the step being trained, its plans and the seconds waited for it."""
        if self.pending is None:
            raise RuntimeError("no batch was handed out for this step")
        return self.pending

    def close(self) -> None:
        if self.source is not None:
            self.source.close()
        self.waiting.end()
        self.publisher.close()
        self.metrics.close()
