"""The GPU kernels written in Triton, by stage like ``cuda/``: ``planning`` (tile ranges), ``relevancy`` (tile
scoring), ``selection`` (the collect of candidates; the exact top-k of long rows for sparse attention) and
``attention`` (the fused sparse-attention kernels). The stage modules ``kernels/gpu/*.py`` import them only where a
Triton kernel is launched: the CPU wheel of torch ships without Triton, and a CPU-only install never loads it.

The BM25 tile pipeline's Triton kernels are the fallback where the CUDA C kernels (``cuda/*.cu``) cannot be compiled
(no NVRTC), and the version CI runs under Triton's interpreter (``TRITON_INTERPRET=1``) on the CPU; same inputs,
outputs and summation order as the CUDA ones.
"""
from __future__ import annotations

import torch


def triton_available() -> bool:
    try:
        import triton  # noqa: F401  (the library, not this package: imports are absolute)
    except ImportError:
        return False
    return True


def programs(device: torch.device, per_sm: int) -> int:
    """Programs of the persistent scoring kernel: ``per_sm`` a multiprocessor (one on the CPU interpreter)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count * per_sm
