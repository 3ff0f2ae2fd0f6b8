"""``CudaKernel`` packs its launch arguments where ``cuLaunchKernel``'s parameter pointers read them. The driver is
replaced by a recorder (CI has no GPU); the kernels themselves run in the CUDA tests of ``test_gpu_backend``."""
from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ragserve.kernels.gpu.cuda.rtc import CudaKernel, RtcError, StreamCopies


class _Driver:
    """Reads each parameter back through the pointer array, as the driver does at launch."""

    def __init__(self, signature: list[str]) -> None:
        self.signature, self.launches = signature, []

    def cuLaunchKernel(self, func, gx, gy, gz, bx, by, bz, smem, stream, params, extra) -> int:
        ptrs = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        kinds = {"ptr": ctypes.c_uint64, "i64": ctypes.c_int64, "i32": ctypes.c_int32, "f32": ctypes.c_float}
        vals = [ctypes.cast(ptrs[i], ctypes.POINTER(kinds[t])).contents.value for i, t in enumerate(self.signature)]
        self.launches.append(((gx, gy, bx, stream), vals))
        return 0


def test_arguments_reach_the_parameter_slots():
    sig = ["ptr", "i64", "i32", "ptr", "f32", "i32", "i64"]
    driver = _Driver(sig)
    kernel = CudaKernel(SimpleNamespace(device=torch.device("cpu"), _cuda=driver), ctypes.c_void_p(1), sig)
    t = torch.zeros(8, dtype=torch.int64)
    kernel((3, 2), 128, t, -(1 << 40), -7, 0xDEADBEEF00, 1.5, np.int32(9), np.int64(1 << 33), stream=11)
    kernel(5, 64, 0, 1, 2, t, 0.0, 3, 4, stream=12)  # reused slots: every value overwritten
    assert driver.launches == [((3, 2, 128, 11), [t.data_ptr(), -(1 << 40), -7, 0xDEADBEEF00, 1.5, 9, 1 << 33]),
                               ((5, 1, 64, 12), [0, 1, 2, t.data_ptr(), 0.0, 3, 4])]
    with pytest.raises(TypeError, match="expected 7 arguments, got 6"):
        kernel(1, 32, t, 1, 2, 3, 4.0, 5, stream=0)


class _GraphDriver:
    """The driver calls of ``StreamCopies``' graphs, recorded; handles are small integers."""

    def __init__(self, instantiate_rc: int = 0) -> None:
        self.calls, self.instantiate_rc = [], instantiate_rc

    def cuStreamBeginCapture_v2(self, stream, mode) -> int:
        self.calls.append(("begin", stream.value, mode))
        return 0

    def cuStreamEndCapture(self, stream, graph) -> int:
        graph._obj.value = 7
        self.calls.append(("end", stream.value))
        return 0

    def cuGraphInstantiateWithFlags(self, exe, graph, flags) -> int:
        exe._obj.value = 9
        self.calls.append(("instantiate", graph.value))
        return self.instantiate_rc

    def cuGraphDestroy(self, graph) -> int:
        self.calls.append(("destroy graph", graph.value))
        return 0

    def cuGraphExecDestroy(self, exe) -> int:
        self.calls.append(("destroy exec", exe.value))
        return 0

    def cuGetErrorString(self, rc, msg) -> int:
        return 0


def test_graph_capture_ends_and_releases_what_it_made():
    """A capture ends whatever the queued work does: on an error the partial graph is destroyed and the error raised;
    otherwise the graph is instantiated and destroyed, and the instance lives until dropped (or the object goes)."""
    driver = _GraphDriver()
    copies = StreamCopies(driver)  # no libcuda in CI: the recorder stands in for it
    queued = []
    assert copies.capture(5, lambda: queued.append(1)) == 9 and queued == [1]
    assert driver.calls == [("begin", 5, 2), ("end", 5), ("instantiate", 7), ("destroy graph", 7)]
    driver.calls.clear()
    with pytest.raises(ZeroDivisionError):
        copies.capture(5, lambda: 1 / 0)
    assert driver.calls == [("begin", 5, 2), ("end", 5), ("destroy graph", 7)]
    driver.calls.clear()
    copies.drop_graph(9)
    assert driver.calls == [("destroy exec", 9)] and not copies._graphs
    failing = StreamCopies(_GraphDriver(instantiate_rc=1))
    with pytest.raises(RtcError, match="cuGraphInstantiate failed"):
        failing.capture(3, lambda: None)
    assert failing._cuda.calls[-1] == ("destroy graph", 7) and not failing._graphs
