"""``fpga`` backend: the ``bm25_topk`` kernel on an Alveo U55C through Xilinx XRT's Python binding ``pyxrt``.

The xclbin holds one compute unit per HBM bank in use, named ``bm25_topk_1 .. bm25_topk_N`` (the names
``hls_bm25/Makefile`` gives them). Shard ``i`` is served by CU ``i + 1``: its arrays are copied once into the
CU's bank (the memory group of each kernel argument), queries are batched into one launch per CU, all CUs
run at once, and the per-shard top-k lists are merged on the host.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import numpy as np

from indexer.reader import IndexReader
from ragserve.kernels.fpga.backend import DEFAULT_BATCH, FpgaHostBackend, FpgaUnavailableError, LaunchResult, QueryBatch

KERNEL = "bm25_topk"
MAX_CUS = 32  # one per HBM pseudo-channel of the U55C
INSTALL_HINT = ("install Xilinx XRT (which provides the pyxrt module) and run `source /opt/xilinx/xrt/setup.sh` "
                "before starting ragserve, then pass --xclbin PATH (built by `make -C hls_bm25 hw`); "
                "without a card, use --backend fpga-sim")


def import_pyxrt() -> ModuleType:
    try:
        return importlib.import_module("pyxrt")
    except ImportError as e:
        raise FpgaUnavailableError(f"the fpga backend needs pyxrt, which is not importable ({e}): {INSTALL_HINT}") from e


class FpgaBackend(FpgaHostBackend):
    name = "fpga"

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        """Usable only where XRT's ``pyxrt`` imports (the card and the bitstream are checked on opening)."""
        try:
            import_pyxrt()
        except FpgaUnavailableError as e:
            return False, str(e)
        return True, ""

    def __init__(self, index: IndexReader, xclbin: str | os.PathLike | None = None, device: int = 0,
                 batch_size: int = DEFAULT_BATCH, **options) -> None:
        pyxrt = import_pyxrt()
        path = xclbin or os.environ.get("RAGSERVE_XCLBIN")
        if not path:
            raise FpgaUnavailableError("the fpga backend needs the kernel bitstream: pass --xclbin PATH "
                                       "(or set RAGSERVE_XCLBIN); build it with `make -C hls_bm25 hw`")
        if not Path(path).is_file():
            raise FpgaUnavailableError(f"xclbin {path} does not exist")
        super().__init__(index, batch_size, **options)
        self.pyxrt = pyxrt
        try:
            self.device = pyxrt.device(device)
            self.uuid = self.device.load_xclbin(pyxrt.xclbin(str(path)))
        except RuntimeError as e:
            raise FpgaUnavailableError(f"cannot load {path} on FPGA device {device}: {e}") from e
        self.kernels = self._open_cus(len(self.shards))
        # Bank-resident shard arrays: copied once, reused by every launch.
        self.shard_bos = [[self._to_device(a, kern, arg) for arg, a in enumerate(sh.arrays())]
                          for sh, kern in zip(self.shards, self.kernels)]

    def _open_cus(self, needed: int) -> list:
        kernels = []
        for i in range(1, MAX_CUS + 1):
            try:
                kernels.append(self.pyxrt.kernel(self.device, self.uuid, f"{KERNEL}:{{{KERNEL}_{i}}}"))
            except RuntimeError:
                break
        if len(kernels) < needed:
            raise FpgaUnavailableError(
                f"the index has {needed} shards but the xclbin has {len(kernels)} {KERNEL} compute units "
                f"(one per shard and HBM bank); rebuild with `make -C hls_bm25 hw NUM_CU={needed}`")
        return kernels[:needed]

    def _bo(self, nbytes: int, kern, arg: int):
        return self.pyxrt.bo(self.device, max(nbytes, 64), self.pyxrt.bo.normal, kern.group_id(arg))

    def _to_device(self, a: np.ndarray, kern, arg: int):
        bo = self._bo(a.nbytes, kern, arg)
        bo.write(a, 0)
        bo.sync(self.pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, a.nbytes, 0)
        return bo

    def _from_device(self, bo, out: np.ndarray) -> None:
        bo.sync(self.pyxrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE, out.nbytes, 0)
        out.reshape(-1).view(np.uint8)[:] = np.asarray(bo.read(out.nbytes, 0)).view(np.uint8)

    def launch(self, batch: QueryBatch) -> list[LaunchResult]:
        n, k = batch.num_queries, batch.k
        inputs = (batch.cache, batch.q_off, batch.q_terms, batch.q_weights)
        runs = []
        for sh, kern, bank in zip(self.shards, self.kernels, self.shard_bos):
            res = LaunchResult.empty(n, k)
            outputs = (res.docids, res.scores, res.counts, res.stats)
            in_bos = [self._to_device(a, kern, 5 + j) for j, a in enumerate(inputs)]
            out_bos = [self._bo(a.nbytes, kern, 9 + j) for j, a in enumerate(outputs)]
            # All CUs start before any is awaited: the shards are searched in parallel.
            runs.append((kern(*bank, *in_bos, *out_bos, *self.scalar_args(batch, sh)), res, out_bos, outputs))
        results = []
        for run, res, out_bos, outputs in runs:
            state = run.wait()
            if state != self.pyxrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED:
                raise RuntimeError(f"{KERNEL} run ended in state {state}")
            for bo, a in zip(out_bos, outputs):
                self._from_device(bo, a)
            results.append(res)
        return results

    def describe(self) -> dict:
        return {**super().describe(), "compute_units": len(self.kernels)}
