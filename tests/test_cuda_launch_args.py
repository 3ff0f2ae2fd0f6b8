"""``CudaKernel`` packs its launch arguments where ``cuLaunchKernel``'s parameter pointers read them. The driver is
replaced by a recorder (CI has no GPU); the kernels themselves run in the CUDA tests of ``test_gpu_backend``."""
from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ragserve.backends.cuda_rtc import CudaKernel


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
