"""Trainer tests run tiny models: one intra-op thread is fastest, above all on a shared, busy machine
(two threads on two contended cores were measured 10-50x slower per step)."""

from __future__ import annotations

import os

import torch

os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)
