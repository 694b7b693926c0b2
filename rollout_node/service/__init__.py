"""Rollout-as-a-Service: a ProRL-Agent-Server-compatible HTTP API (``spoolrl rollout-server``) in
front of the run's rollout nodes. ``wire`` is the wire format, ``frontdoor`` the job table and its
spool bridge, ``app`` the aiohttp routes, ``node``/``policy`` what a rollout node adds for it. The verb is :mod:`hpc.cli.service`."""
