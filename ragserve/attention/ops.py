"""Which device's attention kernels a method runs on, by the arrays it is given: numpy -> ``cpu``; torch on a CUDA
device -> ``triton`` where Triton imports, else ``torch``; torch elsewhere -> ``torch``. The kernels themselves are
``kernels/<device>/attention.py``, found through ``kernels.registry.attention_ops``."""
from __future__ import annotations

from typing import Any

import torch

from ragserve.kernels.registry import attention_ops

_CUDA: list = []  # the kernels CUDA tensors run on, settled once (a failed import is not retried every step)


def ops_for(x) -> Any:
    if not isinstance(x, torch.Tensor):
        return attention_ops("cpu")
    if x.is_cuda:
        if not _CUDA:
            try:
                _CUDA.append(attention_ops("triton"))
            except ImportError:
                _CUDA.append(attention_ops("torch"))
        return _CUDA[0]
    return attention_ops("torch")
