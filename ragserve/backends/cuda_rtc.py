"""Compile CUDA C at run time (NVRTC) and launch it on torch's current stream (CUDA driver API, via ctypes).

No CUDA toolkit is needed: torch's CUDA wheels bring libnvrtc and the driver brings libcuda. Used where a kernel
needs what Triton does not expose (shared memory indexed per thread, block barriers), see ``gpu_tiles_cuda``.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys

import torch

ARG_TYPES = {"ptr": ctypes.c_void_p, "i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float}


class RtcError(RuntimeError):
    pass


def _open(names: list[str], what: str) -> ctypes.CDLL:
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RtcError(f"{what} not found (tried {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}); "
                   "install torch's CUDA build (it depends on the nvidia-cuda-nvrtc wheel)")


def _nvrtc() -> ctypes.CDLL:
    major = (torch.version.cuda or "12").split(".")[0]
    names = [f"libnvrtc.so.{major}", "libnvrtc.so"]
    for base in sys.path:  # pip's nvidia-* wheels: nvidia/cuda_nvrtc/lib (CUDA 12) or nvidia/cu13/lib (CUDA 13)
        names += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libnvrtc.so*")))
    return _open(names, "NVRTC (libnvrtc)")


def _driver() -> ctypes.CDLL:
    lib = _open(["libcuda.so.1", "libcuda.so"], "the CUDA driver (libcuda)")
    lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    return lib


def _check_driver(lib: ctypes.CDLL, rc: int, what: str) -> None:
    if rc != 0:
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(rc, ctypes.byref(msg))
        raise RtcError(f"{what} failed: CUDA error {rc} ({(msg.value or b'?').decode()})")


class CudaKernel:
    """One ``extern "C" __global__`` function compiled for ``device``; ``signature`` names each parameter's type
    (``ptr`` for a tensor, ``i32``, ``i64``, ``f32``)."""

    def __init__(self, source: str, name: str, signature: list[str], options: list[str],
                 device: torch.device) -> None:
        self.types = [ARG_TYPES[t] for t in signature]
        self.device = device
        nvrtc, self._cuda = _nvrtc(), _driver()
        prog = ctypes.c_void_p()
        if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None):
            raise RtcError("nvrtcCreateProgram failed")
        major, minor = torch.cuda.get_device_capability(device)
        opts = [f"--gpu-architecture=sm_{major}{minor}".encode()] + [o.encode() for o in options]
        try:
            if nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts)):
                size = ctypes.c_size_t()
                nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                log = ctypes.create_string_buffer(size.value)
                nvrtc.nvrtcGetProgramLog(prog, log)
                raise RtcError(f"compiling {name} failed:\n{log.value.decode(errors='replace')}")
            size = ctypes.c_size_t()
            nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            cubin = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetCUBIN(prog, cubin)
        finally:
            nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
        with torch.cuda.device(device):
            torch.cuda.synchronize(device)  # the device's primary context is current on this thread
            self._module, self._func = ctypes.c_void_p(), ctypes.c_void_p()
            _check_driver(self._cuda, self._cuda.cuModuleLoadData(ctypes.byref(self._module), cubin),
                          "cuModuleLoadData")
            _check_driver(self._cuda, self._cuda.cuModuleGetFunction(ctypes.byref(self._func), self._module,
                                                                     name.encode()), "cuModuleGetFunction")

    def occupancy(self, block: int) -> tuple[int, int]:
        """(registers per thread, blocks a multiprocessor holds at once) when launched with ``block`` threads."""
        regs, blocks = ctypes.c_int(), ctypes.c_int()
        _check_driver(self._cuda, self._cuda.cuFuncGetAttribute(ctypes.byref(regs), 4, self._func),  # NUM_REGS
                      "cuFuncGetAttribute")
        _check_driver(self._cuda, self._cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), self._func, block, ctypes.c_size_t(0)), "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return regs.value, blocks.value

    def __call__(self, grid: int, block: int, *args) -> None:
        """Launch on the current stream of the kernel's device (asynchronous, like any torch op)."""
        if len(args) != len(self.types):
            raise TypeError(f"expected {len(self.types)} arguments, got {len(args)}")
        vals = [t(a.data_ptr() if isinstance(a, torch.Tensor) else a) for t, a in zip(self.types, args)]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
        stream = torch.cuda.current_stream(self.device).cuda_stream
        _check_driver(self._cuda, self._cuda.cuLaunchKernel(self._func, grid, 1, 1, block, 1, 1, 0,
                                                            ctypes.c_void_p(stream), params, None),
                      "cuLaunchKernel")

