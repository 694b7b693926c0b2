"""The rollout node's INIT -> RUN -> EVAL pipeline.

- :mod:`.node`: the node (feeder, three worker pools with bounded queues, heartbeat, control loop), put
  together from collaborators: :mod:`.claims` (feeder, heartbeat), :mod:`.workers` (stage workers),
  :mod:`.outcomes` (how episodes and groups end), :mod:`.state` (what they share: the spool behind
  one lock, the groups in flight, the drain, the queues). :mod:`.claim`: a claimed task, parsed once.
- :mod:`.stages`: what each stage does to one episode. :mod:`.episode`: groups and episodes.
- :mod:`.faults`: the fault outcome table (also ``docs/faults.md``).
- :mod:`.control`: STOP / cancel markers, policy/LATEST, the job's remaining time.
- :mod:`.sizing`: default worker counts. :mod:`.metrics`: the node's metrics file.
- :mod:`.policy`: the policy interface; :mod:`.scripted`: the scripted policy (tests, debugging);
  :mod:`.llm`: the LLM agent loop as a policy. :mod:`.bindings`: tasks and sandboxes.
- The verb ``spoolrl rollout-node`` (argv, wiring a node, signals, exit status) is :mod:`hpc.cli.rollout`.
"""
