"""The rollout node: sandboxes, tools, the agent loop, tasks and the INIT -> RUN -> EVAL pipeline. Imports no torch."""
