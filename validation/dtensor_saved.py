"""Measure what autograd saves under DTensor tensor parallelism with sequence parallelism.

torchtitan's TP plan (parallelize_llama: ``SequenceParallel`` norms, ``PrepareModuleInput`` from
``Shard(1)`` to ``Replicate()`` before attention and the MLP, ``ColwiseParallel`` /
``RowwiseParallel`` Linears, and the output layer as ``ColwiseParallel(input_layouts=Shard(1))``)
is applied to a small bf16 block (RMSNorm + SwiGLU MLP) and an output layer, on two gloo ranks on
the CPU. Every tensor autograd saves in the forward is recorded by its untyped storage (deduplicated
by ``data_ptr``, counted whole, parameters excluded), as ``validation/activations.py`` does for
Hugging Face models. Run (about 20 s)::

    torchrun --nproc_per_node 2 -m validation.dtensor_saved > validation/data/dtensor_saved.json

``tests/estimator/test_memory.py`` checks ``activations`` against the result.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

TOKENS, HIDDEN, FFN, VOCAB = 2048, 256, 1024, 4096


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(HIDDEN, FFN, bias=False)
        self.w2 = nn.Linear(FFN, HIDDEN, bias=False)
        self.w3 = nn.Linear(HIDDEN, FFN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ffn_norm = nn.RMSNorm(HIDDEN)
        self.feed_forward = FeedForward()
        self.norm = nn.RMSNorm(HIDDEN)
        self.output = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.feed_forward(self.ffn_norm(h))
        return self.output(self.norm(h))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    # a DTensor's shard; an async redistribute's AsyncCollectiveTensor wraps its result in ``elem``
    if isinstance(tensor, DTensor):
        tensor = tensor._local_tensor
    return _local(tensor.elem) if isinstance(tensor, AsyncCollectiveTensor) else tensor


def measure() -> dict[str, Any]:
    tp = dist.get_world_size()
    mesh = init_device_mesh("cpu", (tp,))
    torch.manual_seed(0)
    model = Model().to(torch.bfloat16)
    parallelize_module(
        model,
        mesh,
        {
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            ),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1)),
        },
    )
    parameters = {_local(p).untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, tuple[int, list[int], str]] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        local = _local(tensor)
        storage = local.untyped_storage()
        if storage.data_ptr() not in parameters and local.dim() > 0:
            saved[storage.data_ptr()] = (storage.nbytes(), list(local.shape), str(local.dtype))
        return tensor

    h = torch.randn(1, TOKENS // tp, HIDDEN, dtype=torch.bfloat16, requires_grad=True)  # this rank's shard
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = model(h)
    _local(logits).float().sum().backward()
    full, shard = 2 * TOKENS * HIDDEN, 2 * TOKENS * HIDDEN // tp  # bf16 bytes
    tensors = sorted(saved.values(), key=lambda item: (-item[0], item[1]))
    return {
        "description": "Tensors autograd saves (storages, parameters excluded) for one bf16 SwiGLU MLP "
        "block and an output layer under torchtitan's DTensor TP plan with sequence parallelism, on "
        f"{tp} gloo ranks on the CPU; rank 0. Written by validation/dtensor_saved.py "
        f"(torch {torch.__version__}).",
        "tp": tp,
        "tokens": TOKENS,
        "hidden": HIDDEN,
        "ffn": FFN,
        "vocab": VOCAB,
        "hidden_full_bytes": full,
        "hidden_shard_bytes": shard,
        # the whole sequence's hidden states (16-bit), not this rank's shard of them
        "saved_hidden_full": sum(
            1
            for _, shape, dtype in tensors
            if math.prod(shape) == TOKENS * HIDDEN and dtype == "torch.bfloat16"
        ),
        "saved_tensors": [
            {"bytes": nbytes, "shape": shape, "dtype": dtype} for nbytes, shape, dtype in tensors
        ],
    }


def main() -> None:
    dist.init_process_group("gloo")
    result = measure()
    if dist.get_rank() == 0:
        json.dump(result, sys.stdout, indent=1)
        sys.stdout.write("\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
