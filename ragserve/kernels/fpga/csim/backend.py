"""``fpga-sim`` backend: the FPGA host code driving the ``bm25_topk`` kernel's C simulation (``library``), called
through ctypes once per shard and batch, exactly where the ``fpga`` backend launches a compute unit."""
from __future__ import annotations

import os
import shutil

from indexer.reader import IndexReader
from ragserve.kernels.fpga.backend import DEFAULT_BATCH, FpgaHostBackend, LaunchResult, QueryBatch
from ragserve.kernels.fpga.csim.library import CALL_LOCK, load_library


class FpgaSimBackend(FpgaHostBackend):
    """The FPGA host path with the kernel run in C simulation: bit-identical results, no card needed."""

    name = "fpga-sim"

    def __init__(self, index: IndexReader, batch_size: int = DEFAULT_BATCH, **options) -> None:
        super().__init__(index, batch_size, **options)
        self.lib = load_library()

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        if shutil.which(os.environ.get("CXX", "g++")) is None:
            return False, "no C++ compiler (g++) to build the kernel's C simulation"
        return True, ""

    def launch(self, batch: QueryBatch) -> list[LaunchResult]:
        n, k = batch.num_queries, batch.k
        out = []
        for sh in self.shards:
            r = LaunchResult.empty(n, k)
            with CALL_LOCK:
                self.lib.bm25_topk(*sh.arrays(), batch.cache, batch.q_off, batch.q_terms, batch.q_weights,
                                   r.docids, r.scores, r.counts, r.stats, *self.scalar_args(batch, sh))
            out.append(r)
        return out

