"""The trainer (``spoolrl train-node RUN``): DeepSpeed policy-gradient training over spooled token
trajectories (REINFORCE with a group or step baseline, truncated token-level IS, KL).

Modules, in the order a step uses them:
- ``feeder``: rank 0 puts tasks (epochs, seeded shuffle, ``{instance}@e{epoch}`` ids, backpressure).
- ``consumer``: rank 0 claims shards, assembles complete groups, deduplicates, drops with reasons,
  keeps the exactly-once ledger. ``source``: prepares the next batch while a step trains.
- ``packing``: token-balanced micro-batches per rank, sequences packed without padding, minibatches.
- ``loss``: the policy-gradient objective. ``engine``: the DeepSpeed engine, one step, the non-finite guard.
- ``publish``: weights-only HF policy versions. ``checkpoint``: engine + trainer state, LATEST, lineage.
- ``loop``: the train loop (``lead``: rank 0's own state in it). ``signals``: preemption (exit 75 = requeue). ``faults``: crash-test hooks.
- ``dist_env``: rank/world/rendezvous (torchrun, SlurmEnv, or single).

The verbs (``train-node``, ``checkpoints``) are in :mod:`hpc.cli.train`.
"""
