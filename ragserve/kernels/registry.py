"""Backends by name (a registry, as vLLM and transformers keep attention implementations): each loads lazily."""
from __future__ import annotations

from typing import Callable

from ragserve.kernels.contract import Backend, SearchError

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


def resolve_backend_name(name: str) -> str:
    """``auto`` picks the GPU backend when a GPU is usable, else the CPU backend."""
    if name != "auto":
        return name
    if "gpu" in _REGISTRY:
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
    from ragserve.kernels.fpga.backend import FpgaBackend
    return FpgaBackend


def _load_fpga_sim() -> type[Backend]:
    from ragserve.kernels.fpga.sim import FpgaSimBackend
    return FpgaSimBackend


register_backend("cpu", _load_cpu)
register_backend("gpu", _load_gpu)
register_backend("fpga", _load_fpga)
register_backend("fpga-sim", _load_fpga_sim)
