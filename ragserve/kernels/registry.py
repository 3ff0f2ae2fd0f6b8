"""Backends and attention kernels by name (a registry, as vLLM and transformers keep attention implementations):
each loads lazily, so naming a device never imports another device's libraries (Triton above all)."""
from __future__ import annotations

import glob
import os
from typing import Any, Callable

from ragserve.kernels.contract import AttentionError, Backend, SearchError

_REGISTRY: dict[str, Callable[[], type[Backend]]] = {}


def register_backend(name: str, loader: Callable[[], type[Backend]]) -> None:
    """Register a backend lazily: ``loader`` imports its module only when the backend is used."""
    _REGISTRY[name] = loader


def backend_names() -> list[str]:
    return sorted(_REGISTRY)


def get_backend_class(name: str) -> type[Backend]:
    if name not in _REGISTRY:
        raise SearchError(f"unknown backend {name!r}; choose one of: {', '.join(backend_names())}, auto")
    return _REGISTRY[name]()


# Device nodes a GPU that torch could use shows (NVIDIA, WSL's /dev/dxg, ROCm's /dev/kfd). Without any of them no
# GPU is usable, and ``auto`` is answered without importing the GPU backend, whose torch import costs ~0.65 s of
# every CLI call on a CPU machine.
_GPU_NODES = ("/dev/nvidia[0-9]*", "/dev/dxg", "/dev/kfd", "/proc/driver/nvidia")


def gpu_device_present() -> bool:
    return any(glob.glob(p) if "*" in p else os.path.exists(p) for p in _GPU_NODES)


def resolve_backend_name(name: str) -> str:
    """``auto`` picks the GPU backend when a GPU is usable, else the CPU backend."""
    if name != "auto":
        return name
    if "gpu" in _REGISTRY and gpu_device_present():
        ok, _ = get_backend_class("gpu").is_available()
        if ok:
            return "gpu"
    return "cpu"


def _load_cpu() -> type[Backend]:
    from ragserve.kernels.cpu.backend import CpuBackend
    return CpuBackend


def _load_gpu() -> type[Backend]:
    from ragserve.kernels.gpu.backend import GpuBackend
    return GpuBackend


def _load_fpga() -> type[Backend]:
    from ragserve.kernels.fpga.xrt.backend import FpgaBackend
    return FpgaBackend


def _load_fpga_sim() -> type[Backend]:
    from ragserve.kernels.fpga.csim.backend import FpgaSimBackend
    return FpgaSimBackend


register_backend("cpu", _load_cpu)
register_backend("gpu", _load_gpu)
register_backend("fpga", _load_fpga)
register_backend("fpga-sim", _load_fpga_sim)


# -- attention kernels: one ``attention`` module a device, the same operations under the same names ------------
_OPS: dict[str, Callable[[], Any]] = {}
_OPS_LOADED: dict[str, Any] = {}


def register_attention_ops(name: str, loader: Callable[[], Any]) -> None:
    """Register a device's attention kernels lazily: ``loader`` imports their module and returns the kernels."""
    _OPS[name] = loader
    _OPS_LOADED.pop(name, None)


def attention_ops_names() -> list[str]:
    return sorted(_OPS)


def attention_ops(name: str) -> Any:
    """The attention kernels named ``name`` (one shared instance); ImportError where their library is missing."""
    if name not in _OPS:
        raise AttentionError(f"unknown attention kernels {name!r}; choose one of: {', '.join(attention_ops_names())}")
    if name not in _OPS_LOADED:
        _OPS_LOADED[name] = _OPS[name]()
    return _OPS_LOADED[name]


def _ops_cpu() -> Any:
    from ragserve.kernels.cpu.attention import CPU
    return CPU


def _ops_fpga_sim() -> Any:
    from ragserve.kernels.fpga.attention import FPGA_SIM
    return FPGA_SIM


def _ops_torch() -> Any:
    from ragserve.kernels.gpu.attention import TORCH
    return TORCH


def _ops_triton() -> Any:
    from ragserve.kernels.gpu.attention import TritonOps
    return TritonOps()


register_attention_ops("cpu", _ops_cpu)
register_attention_ops("fpga-sim", _ops_fpga_sim)
register_attention_ops("torch", _ops_torch)
register_attention_ops("triton", _ops_triton)
