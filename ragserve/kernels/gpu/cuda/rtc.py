"""Compile CUDA C at run time (NVRTC) and launch it on torch's current stream (CUDA driver API, via ctypes);
copies through pinned memory, events and captured graphs straight through the driver (``StreamCopies``).

No CUDA toolkit is needed: torch's CUDA wheels bring libnvrtc (the ``nvidia-cuda-nvrtc`` wheel) and the driver brings
libcuda. Used where a kernel needs what Triton does not expose (shared memory indexed per thread, block barriers), see
``*.cu`` and ``kernels``, and where a torch op's tens of microseconds of Python would dominate a single
query's latency. ``compile_cubin`` needs no GPU: CI compiles every kernel for sm_90 with it.
"""
from __future__ import annotations

import ctypes
import glob
import os
import struct
import sys
from typing import Callable

import torch

PACK = {"ptr": "Q", "i32": "i4x", "i64": "q", "f32": "f4x"}  # a kernel parameter's struct format in its 8-byte slot


class RtcError(RuntimeError):
    pass


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream(device: torch.device) -> int:
    """The ``cuda_stream`` handle of ``device``'s current stream. Through torch's raw accessor where it has one (as
    Triton does): building a ``torch.cuda.Stream`` object costs microseconds, and a single query waits on them."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


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
    lib = _open(names, "NVRTC (libnvrtc)")
    # NVRTC opens libnvrtc-builtins by its soname at compile time: where the wheel's folder is not on the loader's path
    # (no CUDA torch imported it first), it is loaded from beside libnvrtc.
    if lib._name and os.path.isabs(lib._name):
        for builtins in sorted(glob.glob(os.path.join(os.path.dirname(lib._name), "libnvrtc-builtins.so*"))):
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    return lib


def _driver() -> ctypes.CDLL:
    lib = _open(["libcuda.so.1", "libcuda.so"], "the CUDA driver (libcuda)")
    lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    lib.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.cuMemcpyDtoHAsync_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
    lib.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cuEventRecordWithFlags.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
    lib.cuEventSynchronize.argtypes = [ctypes.c_void_p]
    lib.cuEventElapsedTime.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.cuStreamWaitEvent.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
    lib.cuGraphLaunch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return lib


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC that ``compile_cubin`` loads."""
    nvrtc, major, minor = _nvrtc(), ctypes.c_int(), ctypes.c_int()
    nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def compile_cubin(source: str, options: list[str], arch: str, name: str = "module") -> bytes:
    """CUDA C ``source`` compiled by NVRTC into machine code (a cubin) for ``arch`` (e.g. ``sm_90``) with ``options``;
    no GPU needed. Raises ``RtcError`` with NVRTC's log when it does not build."""
    nvrtc = _nvrtc()
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None):
        raise RtcError("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture={arch}".encode()] + [o.encode() for o in options]
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
    return cubin.raw


def _check_driver(lib: ctypes.CDLL, rc: int, what: str) -> None:
    if rc != 0:
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(rc, ctypes.byref(msg))
        raise RtcError(f"{what} failed: CUDA error {rc} ({(msg.value or b'?').decode()})")


class CudaModule:
    """CUDA C source compiled for ``device``; ``kernel(name, signature)`` gives one of its ``extern "C"`` functions."""

    def __init__(self, source: str, options: list[str], device: torch.device, name: str = "module") -> None:
        self.device = device
        self._cuda = _driver()
        major, minor = torch.cuda.get_device_capability(device)
        cubin = compile_cubin(source, options, f"sm_{major}{minor}", name)
        with torch.cuda.device(device):
            torch.cuda.synchronize(device)  # the device's primary context is current on this thread
            self._module = ctypes.c_void_p()
            _check_driver(self._cuda, self._cuda.cuModuleLoadData(ctypes.byref(self._module), cubin),
                          "cuModuleLoadData")

    def kernel(self, name: str, signature: list[str]) -> "CudaKernel":
        func = ctypes.c_void_p()
        _check_driver(self._cuda, self._cuda.cuModuleGetFunction(ctypes.byref(func), self._module, name.encode()),
                      f"cuModuleGetFunction({name})")
        return CudaKernel(self, func, signature)


class CudaKernel:
    """One function of a ``CudaModule``; ``signature`` names each parameter's type (``ptr`` for a tensor, ``i32``,
    ``i64``, ``f32``). Its arguments are packed into one reused buffer (a launch costs a few microseconds of Python
    instead of tens), so one kernel object must not be launched from two threads at once."""

    def __init__(self, module: CudaModule, func: ctypes.c_void_p, signature: list[str]) -> None:
        self.device, self._cuda, self._func = module.device, module._cuda, func
        self._module = module  # keeps the module loaded
        self._n = len(signature)
        # One 8-byte slot per parameter (an i32 or f32 in its first 4 bytes), packed by one struct call.
        self._pack = struct.Struct("<" + "".join(PACK[t] for t in signature)).pack_into
        self._buf = ctypes.create_string_buffer(8 * max(1, self._n))
        base = ctypes.addressof(self._buf)
        self._params = (ctypes.c_void_p * max(1, self._n))(*[base + 8 * i for i in range(self._n)])

    def occupancy(self, block: int) -> tuple[int, int]:
        """(registers per thread, blocks a multiprocessor holds at once) when launched with ``block`` threads."""
        regs, blocks = ctypes.c_int(), ctypes.c_int()
        _check_driver(self._cuda, self._cuda.cuFuncGetAttribute(ctypes.byref(regs), 4, self._func),  # NUM_REGS
                      "cuFuncGetAttribute")
        _check_driver(self._cuda, self._cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), self._func, block, ctypes.c_size_t(0)), "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return regs.value, blocks.value

    def __call__(self, grid: int | tuple[int, int], block: int, *args, stream: int | None = None) -> None:
        """Launch on ``stream`` (a ``cuda_stream`` handle; default the current stream of the kernel's device),
        asynchronous like any torch op. A tensor argument passes its data pointer, as may an int (faster: no
        lookup)."""
        if len(args) != self._n:
            raise TypeError(f"expected {self._n} arguments, got {len(args)}")
        self._pack(self._buf, 0, *[a if type(a) is int else a.data_ptr() if isinstance(a, torch.Tensor) else a
                                   for a in args])
        gx, gy = grid if isinstance(grid, tuple) else (grid, 1)
        if stream is None:
            stream = current_stream(self.device)
        _check_driver(self._cuda, self._cuda.cuLaunchKernel(self._func, gx, gy, 1, block, 1, 1, 0, stream, self._params,
                                                            None), "cuLaunchKernel")


class StreamCopies:
    """Asynchronous copies between pinned host memory and the device, events to wait for, and graphs (the work queued
    on a stream, captured once and replayed by one launch), straight through the driver: a few microseconds of Python
    each where a torch copy costs tens (a single query's latency is mostly such host work). Addresses are
    ``data_ptr()`` values, streams ``cuda_stream`` handles. Create it with the device's context current (inside
    ``torch.cuda.device``)."""

    def __init__(self, driver=None) -> None:
        self._cuda = driver if driver is not None else _driver()  # a recorder stands in for libcuda in CI's tests
        self._events: list[ctypes.c_void_p] = []
        self._streams: list[ctypes.c_void_p] = []
        self._graphs: set[int] = set()

    def event(self, timing: bool = False) -> ctypes.c_void_p:
        """A new event (with ``timing``: one ``elapsed`` can read); it is destroyed with this object."""
        ev = ctypes.c_void_p()
        flags = 0 if timing else 2  # CU_EVENT_DEFAULT or CU_EVENT_DISABLE_TIMING
        _check_driver(self._cuda, self._cuda.cuEventCreate(ctypes.byref(ev), flags), "cuEventCreate")
        self._events.append(ev)
        return ev

    def elapsed(self, start: ctypes.c_void_p, end: ctypes.c_void_p) -> float:
        """Seconds between the last records of two timing events (both done)."""
        ms = ctypes.c_float()
        _check_driver(self._cuda, self._cuda.cuEventElapsedTime(ctypes.byref(ms), start, end), "cuEventElapsedTime")
        return ms.value / 1e3

    def stream(self) -> int:
        """A new stream that does not wait for the legacy default one (copies beside the kernels); it is destroyed
        with this object."""
        st = ctypes.c_void_p()
        _check_driver(self._cuda, self._cuda.cuStreamCreate(ctypes.byref(st), 1), "cuStreamCreate")  # NON_BLOCKING
        self._streams.append(st)
        return st.value

    def after(self, stream: int, event: ctypes.c_void_p) -> None:
        """Work queued on ``stream`` from now on waits for ``event``'s last record."""
        _check_driver(self._cuda, self._cuda.cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")

    def record(self, event: ctypes.c_void_p, stream: int) -> None:
        _check_driver(self._cuda, self._cuda.cuEventRecord(event, stream), "cuEventRecord")

    def record_in_graph(self, event: ctypes.c_void_p, stream: int) -> None:
        """Inside a ``capture`` of ``stream``: the graph records ``event`` when the work queued before is done (an
        event record node), each time it is launched."""
        rc = self._cuda.cuEventRecordWithFlags(event, stream, 1)  # CU_EVENT_RECORD_EXTERNAL
        _check_driver(self._cuda, rc, "cuEventRecordWithFlags")

    def wait_event(self, event: ctypes.c_void_p) -> None:
        """Until the work before the event's last record is done (at once if it was never recorded)."""
        _check_driver(self._cuda, self._cuda.cuEventSynchronize(event), "cuEventSynchronize")

    def to_device(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        _check_driver(self._cuda, self._cuda.cuMemcpyHtoDAsync_v2(dst, src, nbytes, stream), "cuMemcpyHtoDAsync")

    def to_host(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        _check_driver(self._cuda, self._cuda.cuMemcpyDtoHAsync_v2(dst, src, nbytes, stream), "cuMemcpyDtoHAsync")

    def capture(self, stream: int, queue: Callable[[], None]) -> int:
        """A graph of the work ``queue()`` puts on ``stream`` (one this object made: not the legacy default stream),
        instantiated: nothing runs until ``launch_graph``. A copy in it reads its pinned host source when the graph
        runs; kernel arguments are fixed as they were queued."""
        _check_driver(self._cuda, self._cuda.cuStreamBeginCapture_v2(ctypes.c_void_p(stream), 2),  # RELAXED
                      "cuStreamBeginCapture")
        graph = ctypes.c_void_p()
        try:
            queue()
        except BaseException:  # the stream leaves capture mode, and the partial graph goes
            self._cuda.cuStreamEndCapture(ctypes.c_void_p(stream), ctypes.byref(graph))
            if graph.value:
                self._cuda.cuGraphDestroy(graph)
            raise
        _check_driver(self._cuda, self._cuda.cuStreamEndCapture(ctypes.c_void_p(stream), ctypes.byref(graph)),
                      "cuStreamEndCapture")
        exe = ctypes.c_void_p()
        try:
            _check_driver(self._cuda, self._cuda.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph,
                                                                             ctypes.c_ulonglong(0)),
                          "cuGraphInstantiate")
        finally:
            self._cuda.cuGraphDestroy(graph)
        self._graphs.add(exe.value)
        return exe.value

    def launch_graph(self, graph: int, stream: int) -> None:
        _check_driver(self._cuda, self._cuda.cuGraphLaunch(graph, stream), "cuGraphLaunch")

    def drop_graph(self, graph: int) -> None:
        self._graphs.discard(graph)
        self._cuda.cuGraphExecDestroy(ctypes.c_void_p(graph))

    def device_address(self, host: int) -> int:
        """The device's address of pinned host memory: kernels read and write it directly (no copy to wait for)."""
        dev = ctypes.c_uint64()
        _check_driver(self._cuda, self._cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(dev), ctypes.c_void_p(host), 0),
                      "cuMemHostGetDevicePointer")
        return dev.value

    def __del__(self) -> None:
        for g in getattr(self, "_graphs", ()):
            self._cuda.cuGraphExecDestroy(ctypes.c_void_p(g))
        for ev in getattr(self, "_events", ()):
            self._cuda.cuEventDestroy_v2(ev)
        for st in getattr(self, "_streams", ()):
            self._cuda.cuStreamDestroy_v2(st)
