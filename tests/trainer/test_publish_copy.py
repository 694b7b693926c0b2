"""The publish path copies the weights to the CPU once (issue 39 item 3).

``Engine.full_state_dict`` snapshots every tensor with ``engine._cpu_copy`` (one ``aten::_to_copy`` per tensor:
``.cpu().clone()`` would copy an accelerator's tensor twice), and the publisher's write
(``publish._untie``) hands contiguous tensors to safetensors without another copy. Counted with a torch
dispatch mode over the real functions, on CPU tensors (no accelerator here: ``.cpu()`` of a CPU tensor copies
nothing, so the accelerator's double copy itself is not exercised; a second copy anywhere on this path is).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import PretrainedConfig

from train_node.trainer.engine import _cpu_copy
from train_node.trainer.publish import _untie

COPIES = {"_to_copy", "copy_", "clone", "contiguous"}


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_one_copy_per_tensor_from_snapshot_to_safetensors() -> None:
    sd = {"embed.weight": torch.randn(8, 4), "lm_head.weight": torch.randn(8, 4), "norm.weight": torch.ones(4)}
    with CountOps() as counted:
        snap = _cpu_copy(sd)
    assert sum(n for op, n in counted.ops.items() if op in COPIES) == len(sd), counted.ops
    for name, tensor in sd.items():
        assert snap[name].device.type == "cpu" and torch.equal(snap[name], tensor)
        assert snap[name].data_ptr() != tensor.data_ptr()  # a snapshot: training may change the source in place
    sd["norm.weight"].add_(1.0)
    assert torch.equal(snap["norm.weight"], torch.ones(4))

    with CountOps() as counted:
        written = _untie(snap, PretrainedConfig(tie_word_embeddings=False))  # type: ignore[call-arg]  # typed __init__ omits **kwargs
    assert not set(counted.ops) & COPIES, counted.ops  # no second copy on the way to safetensors
    assert all(written[k].data_ptr() == snap[k].data_ptr() for k in written)
