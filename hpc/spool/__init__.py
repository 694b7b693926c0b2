"""The spool: a task queue and a trajectory-shard queue on a shared filesystem, with no server.

Layout under ``RUN/spool/`` (``RUN/control/fence/`` holds the consumer generations)::

    tasks/ready/<task>@<attempt>        tasks/claimed/<worker>/<task>@<attempt>     tasks/done/<task>@<attempt>
    heartbeats/<worker>                 (a counter that changes while the worker lives)
    shards/ready/<shard>.shard          shards/claimed/<consumer>@g<generation>/<shard>.shard
    shards/committed/<shard>.shard      shards/quarantine/<shard>.shard (+ .reason.json)
    shards/commits/<generation>-....json  (what each commit covered, and which rows it dropped)
    dropped/<...>.json                  (trajectories dropped elsewhere, with the reason; counted by ``stats``)

Guarantees (mechanisms: temp + fsync + rename; claim by rename; heartbeat counters judged on the
reader's own monotonic clock; never flock/fcntl, inotify or sub-second mtimes):

- Each task and each shard goes to exactly one claimer (see :mod:`hpc.spool.lease`, :mod:`hpc.shard`).
- Exactly once into the model: a trainer claims shards, trains, checkpoints the shard ids, then
  ``commit``s. After a crash, ``fence`` + ``recover(consumer, ids_in_latest_checkpoint)`` commits
  those and returns every other claimed shard to ``ready/``. A stale trainer (older generation)
  gets :class:`FencedError` from ``commit``/``recover``. Shard claims are never reclaimed by
  lease: a trainer may legitimately hold shards through a long step, only its successor frees them.
  Generations live in :mod:`hpc.spool.fencing`; ``check_fence`` lets the trainer refuse its own writes.
- Each commit record names the checkpoint that covers it; when a resume finds that checkpoint torn
  and falls back past it, ``uncommit`` returns its shards to ready and voids the record, so what
  it trained is trained again in the surviving lineage (never lost, never twice in it).
- Deduplication by task id: the first writer session (and attempt) that delivers a task id owns
  it; rows of that task from any other shard are dropped with reason ``duplicate_task`` and the
  drop is written into the commit record. This absorbs the late result of a worker that was
  stopped past its lease (its ``finish_task`` also answers False). The owners are rebuilt from the
  commit records, so the rule survives trainer restarts. One consumer generation should claim
  through one Spool object (rank 0), which is how the trainer uses it.
- A corrupt or truncated shard is moved to ``quarantine/`` with a reason and counted; the reader
  carries on. Every trajectory ends committed (trained), dropped with a reason, quarantined, or
  still queued: :meth:`Spool.stats` counts each.
- Shards are claimed in the order the consumer first listed them (:mod:`hpc.arrival`), never by
  the writer's wall-clock time that opens each shard id: a skewed clock neither jumps nor starves.
- Idle polling (``claim_shards(..., if_changed=True)``) costs one ``stat`` of ``shards/ready`` per
  poll; it lists only when the directory's attributes changed (and once more a few seconds later,
  so a coarse timestamp never hides a shard). On NFS the client's directory attribute cache
  (acdirmin/acdirmax) delays what any poll can see; mount the run directory with a small one
  (e.g. ``actimeo=1``) for a quick hand-over.

Two faces (:mod:`hpc.spool.faces`), both implemented by one :class:`Spool` composed of a task
queue, a shard queue and a fence (:mod:`hpc.spool.spool`); roles import only this package:

- :class:`RolloutSpool`, what production rollout nodes call (``rollout_node.pipeline``):
  ``claim_task`` (which also reclaims the leases of dead workers, at most about every lease/4) ->
  ``heartbeat`` from a thread every ``heartbeat_interval_s`` (which watches for the dead too, so a node
  that may not claim now keeps their lease clock running) -> ``writer(...).add_group`` ->
  ``finish_task`` once the group's shard is published (False = the lease was lost: the result is
  deduplicated, never trained twice) or ``release_task``; ``pending_work`` before claiming
  (backpressure against ``max_ready_shards``), ``task_counts`` for ``--once``.
- :class:`ConsumerSpool`, what the trainer's rank 0 (``train_node.trainer``) and the rollout
  service's front door call: ``fence`` -> ``recover`` (or ``uncommit`` after a torn checkpoint) ->
  ``claim_shards(..., if_changed=True)`` in its poll loop -> ``commit`` after each checkpoint, with
  ``check_fence`` before its own writes; the trainer's feeder ``put_tasks``, asks ``open_tasks`` and
  ``unconsumed_shards`` and ``reissue_task``s what was lost; the front door reads ``task_holders``.
- ``stats`` is for operators (``spoolrl spool stats``, ``spoolrl status``).

A Spool object belongs to one process; only ``heartbeat`` may run in another thread (its watch for the
dead may race a claim's: both rename with ``FileNotFoundError`` tolerated, a moved task is in ``ready/``
whichever listing finds it).
Known limit: a fenced trainer that passed its fence check just before a newer one fenced can
still commit the shards it holds (no lock spans check and rename on these filesystems); the
newer trainer then never sees them as ready, so they are trained by the stale one only.
"""

from hpc.arrival import SETTLE_S
from hpc.shard import ShardWriter
from hpc.spool.faces import ConsumerSpool, RolloutSpool
from hpc.spool.lease import TaskLease
from hpc.spool.shards import Shard
from hpc.spool.spool import Spool

__all__ = ["SETTLE_S", "ConsumerSpool", "RolloutSpool", "Shard", "ShardWriter", "Spool", "TaskLease"]
