"""The GPU backend: exact BM25 top-k on a CUDA device (torch, Triton and CUDA C kernels), batched.

The layout's arrays go to the device as they are (``postings.u32``, ``blk_id.u32``, ``blk_start.u32`` of each
shard, concatenated into one arena, and ``norms.u8``; ``memory`` plans what fits, and its ``DeviceArena`` holds it).
The host turns a batch of queries into work items (query, term, shard: ``planning``). Two paths, both equal to the
CPU backend bit for bit, and three scorers (``scorer=``, named by what runs; ``auto``, the default: the first of them
that runs here):
- ``cuda`` and ``triton``, the tiled path: ``relevancy.TileScorer`` scores doc tiles on chip in the canonical term
  order, with the CUDA C kernels (``cuda/*.cu``, compiled by NVRTC) or Triton's (``triton/``: where NVRTC is
  missing, and under Triton's interpreter in CI), and keeps only group maxima and the scores that can reach the
  top-k; the CUDA C kernel adds the terms of a query whose f64 sum is exact in any order (``bm25.sum_is_exact``) all
  at once with shared-memory atomics, as 64-bit fixed-point sums (``planning.flat_shift``);
  ``selection.TileSelector`` finds the top-k from them;
- ``torch`` (any device, the reference), the dense path: a dense f64 accumulator of shape [queries, num_docs]; a
  query whose f64 sum is exact in any order (``bm25.sum_is_exact``) is scored in one launch, otherwise its terms go
  one launch each in ascending term id, so every cell sums in the canonical order (``relevancy.score_torch``,
  ``selection.select_topk``).
Shards that do not fit the memory budget stay on the host and are staged per batch. On the tiled path, batches
run in a pipeline: the host plans batch n + 1 and queues it behind batch n's selection, then ranks batch n's
candidates while the device scores batch n + 1. A single query the device plans (every shard resident, CUDA kernels)
is one CUDA graph launch (``graphs``), with or without stage times: the path the searcher, the server and the RAG
loops take for one query. The two paths are ``pipeline.TiledPath`` and ``pipeline.DensePath``; this backend picks
the scorer, plans the memory, fills the arena and hands each call to its path on the device.

Tuning comes in one ``GpuSettings`` (``settings=``); the options here choose the path and the device.

Nothing global is touched: every tensor lives on the configured device, and kernels run inside
``torch.cuda.device(...)`` so a generator can share the GPU (and the current device is restored).
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings

import numpy as np
import torch

from indexer import bm25
from indexer.bm25 import QueryTerms
from indexer.reader import IndexReader
from ragserve.kernels.contract import Backend, SearchError, StageTimes, TopK
from ragserve.kernels.gpu import relevancy as R
from ragserve.kernels.gpu.cuda.kernels import TileKernels
from ragserve.kernels.gpu.cuda.rtc import RtcError, StreamCopies
from ragserve.kernels.gpu.graphs import QueryGraphs
from ragserve.kernels.gpu.memory import DeviceArena, MemoryPlan, MemoryPlanError, plan_memory
from ragserve.kernels.gpu.pipeline import DensePath, TiledPath
from ragserve.kernels.gpu.planning import ItemPlanner, QueryTables, tile_size
from ragserve.kernels.gpu.relevancy import TileScorer
from ragserve.kernels.gpu.selection import METHODS as TOPK_METHODS, TileSelector
from ragserve.kernels.gpu.settings import GpuSettings
from ragserve.kernels.gpu.triton import triton_available

SCORERS = ("auto", "cuda", "triton", "torch")  # "auto": the first of the others that runs on the device


def _resolve_device(device: str | None) -> torch.device:
    if device is None:
        if not torch.cuda.is_available():
            raise SearchError("no CUDA device is visible to torch; pass device='cpu' to run the gpu backend on the CPU")
        return torch.device("cuda", torch.cuda.current_device())
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise SearchError(f"bad device {device!r}: {e}") from e
    if d.type == "cpu":
        return d
    if d.type != "cuda":
        raise SearchError(f"unsupported device {device!r} (use 'cuda', 'cuda:N' or 'cpu')")
    if not torch.cuda.is_available():
        raise SearchError(f"device {device!r} asked for, but no CUDA device is visible to torch")
    idx = torch.cuda.current_device() if d.index is None else d.index
    if idx >= torch.cuda.device_count():
        raise SearchError(f"device {device!r} does not exist ({torch.cuda.device_count()} CUDA device(s))")
    return torch.device("cuda", idx)


class GpuBackend(Backend):
    name = "gpu"

    def __init__(self, index: IndexReader, device: str | None = None, memory_bytes: int | None = None,
                 max_batch: int = 64, scorer: str = "auto", term_order: str = "auto", topk: str = "blockmax",
                 settings: GpuSettings | None = None, **options) -> None:
        super().__init__(index)
        if options:
            raise SearchError(f"unknown option(s) for the gpu backend: {', '.join(sorted(options))}")
        if settings is not None and not isinstance(settings, GpuSettings):
            raise SearchError(f"settings must be a GpuSettings, got {type(settings).__name__}")
        self.settings = settings = settings or GpuSettings()
        if term_order not in ("auto", "ascending"):
            raise SearchError(f"term_order must be 'auto' or 'ascending', got {term_order!r}")
        if topk not in TOPK_METHODS:
            raise SearchError(f"topk must be one of {', '.join(TOPK_METHODS)}, got {topk!r}")
        self.topk = topk
        self.device = _resolve_device(device)
        self.term_order = term_order
        self._cuda = self.device.type == "cuda"
        self._threads = threading.local()  # which threads have the device's context bound (``_is_current``)
        self.num_docs = index.num_docs
        self.block_shift = index.block_size.bit_length() - 1
        self._n_blocks = -(-self.num_docs // index.block_size)
        self.tf_bits = index.tf_bits
        if memory_bytes is None:
            memory_bytes = self._default_budget()
        shard_sizes = [(int(s.postings.size), int(s.blk_id.size)) for s in index.shards]
        self._tile = tile_size(index.block_size, settings.tile_max)
        tpb = index.block_size // self._tile
        # The CUDA C kernels (compiled now) and the driver's copies where the tiled path runs on CUDA.
        self.scorer, kernels, copies = self._pick_scorer(scorer, tpb)
        tiled = self.scorer != "torch"
        # Host-side tables: work items are planned from them; streamed shards are staged from the layout.
        self._planner = ItemPlanner([s.term_ptr for s in index.shards], [s.blk_start for s in index.shards],
                                    [s.blk_id for s in index.shards])
        # The CUDA tile kernels plan single queries on the device where every shard fits beside its term_ptr.
        tables = QueryTables.nbytes(self._planner, self._n_blocks, tpb) if kernels is not None else 0
        samples = TileScorer.sample_bytes_per_posting(tpb) if kernels is not None else 0.0
        self.plan: MemoryPlan = self._plan_memory(shard_sizes, int(memory_bytes), max_batch, tiled, tables, samples)
        norms = np.asarray(index.norms)
        # Smallest possible q over the index (tf >= 1, longest length present): proves f64 sums exact.
        self._max_norm = int(norms.max()) if norms.size else 0
        self._caches: dict[tuple[float, float], tuple[np.ndarray, torch.Tensor]] = {}
        self._tiled: TiledPath | None = None
        self._dense: DensePath | None = None
        with self._on_device():
            self._arena = arena = DeviceArena(index, self.plan, self.device, settings.bounce_elems)
            if not tiled:
                self._dense = DensePath(arena, self._planner, self.plan, self.num_docs, self.tf_bits, self.block_shift,
                                        self.device, term_order, topk)
                return
            tiles = TileScorer(self.num_docs, index.block_size, self.tf_bits, self.plan.rows, self.device, settings,
                               kernels, copies)
            selector = TileSelector(tiles, self.plan.rows, settings)
            tiles.sample(arena.post, 0, arena.stage_p)  # the resident shards' postings
            graphs = None
            if self.plan.table_bytes:
                tiles.set_query_tables(QueryTables.build(
                    self._planner, arena.ebase, arena.pbase, [(s.block_start, s.block_end) for s in index.shards],
                    arena.bid, arena.bst, self.device))
                graphs = QueryGraphs(tiles, selector, settings)
            self._tiled = TiledPath(tiles, selector, graphs, arena, self._planner, self.plan, self._n_blocks,
                                    term_order, self._cuda)

    # -- setup --------------------------------------------------------------------------------
    def _plan_memory(self, shard_sizes: list[tuple[int, int]], budget: int, max_batch: int, tiled: bool,
                     tables: int, samples: float) -> MemoryPlan:
        """The memory plan with ``tables`` bytes of device-plan tables where every shard still fits beside them;
        otherwise without them (shards stream, or nothing fits: ``MemoryPlanError``). ``samples``: the CUDA kernels'
        bytes a posting."""
        block, tile = self.index.block_size, self._tile

        def plan(table_bytes: int) -> MemoryPlan:
            return plan_memory(self.num_docs, shard_sizes, budget, max_batch,
                               row_bytes=TileScorer.row_bytes(self.num_docs, block, tile) if tiled else None,
                               work_bytes=(TileScorer.work_bytes(self.device, tile, self.settings)
                                           if self.scorer == "triton" else 0),
                               table_bytes=table_bytes, posting_extra=samples)

        if tables:
            try:
                with_tables = plan(tables)
                if not with_tables.streamed:
                    return with_tables
            except MemoryPlanError:
                pass
        return plan(0)

    def _pick_scorer(self, scorer: str, tpb: int) -> tuple[str, TileKernels | None, StreamCopies | None]:
        """What scores, and the CUDA parts it drives (``relevancy.cuda_parts``): ``cuda`` (the tiled path on the CUDA C
        kernels), ``triton`` (the tiled path on Triton's), ``torch`` (the dense path); ``auto``: ``cuda`` where
        they compile, else ``triton`` where it is installed (with a warning when NVRTC failed), else ``torch``."""
        if scorer not in SCORERS:
            raise SearchError(f"scorer must be one of {', '.join(SCORERS)} (auto, or the kernels that run: CUDA C, "
                              f"Triton or torch), got {scorer!r}")
        if scorer == "torch" or (scorer == "auto" and self.device.type != "cuda"):
            return "torch", None, None
        if scorer in ("auto", "cuda"):
            try:
                kernels, copies = R.cuda_parts(self._tile, tpb, self.device, self.settings, "cuda")
            except RtcError as e:
                if scorer == "cuda":
                    raise SearchError(f"scorer='cuda': the CUDA C kernels do not compile here ({e}); "
                                      f"scorer='triton' runs Triton's") from None
                warnings.warn(f"the CUDA C tile kernels are unavailable, using Triton's (2.2x slower): {e}")
                kernels = None
            if kernels is not None:
                return "cuda", kernels, copies
            if scorer == "cuda":
                why = ("needs a CUDA device" if self.device.type != "cuda"
                       else f"needs tiles of at least {R.GROUP} docs (doc blocks of {self.index.block_size})")
                raise SearchError(f"scorer='cuda' runs the CUDA C kernels, which {why}")
            if not triton_available():
                return "torch", None, None
        else:
            if not triton_available():
                raise SearchError("scorer='triton' asked for, but triton is not installed")
            # Triton's interpreter (TRITON_INTERPRET=1) runs the same kernels on CPU tensors, for checking them.
            if self.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
                raise SearchError("scorer='triton' needs a CUDA device (or TRITON_INTERPRET=1)")
        return ("triton", *R.cuda_parts(self._tile, tpb, self.device, self.settings, "triton"))

    def _default_budget(self) -> int:
        if self.device.type != "cuda":
            return 1 << 62  # host memory: no device limit to plan for
        free, _ = torch.cuda.mem_get_info(self.device)
        return int(free * self.settings.budget_fraction)

    def _on_device(self):
        """The backend's device made current for a search (its kernels launch in the current context). Nothing to do
        where it already is: ``torch.cuda.device`` costs a single query ~2.5 us (H200 host)."""
        if self._is_current():
            return contextlib.nullcontext()
        return torch.cuda.device(self.device)

    def _is_current(self) -> bool:
        """Is the backend's device the current one (or not a CUDA device)? torch's raw query: ``current_device()``
        costs a single query ~1 us more, and CUDA is initialised since the index was loaded."""
        if not self._cuda:
            return True
        if not getattr(self._threads, "bound", False):
            # A thread's first search (a server's worker thread, say): the single-query graph calls the driver
            # directly, which needs a context current on this thread, and the runtime binds the device's primary
            # context only at a call that needs one. Without this, every single query of a new thread failed.
            torch.cuda.synchronize(self.device)
            self._threads.bound = True
        return torch._C._cuda_getDevice() == self.device.index

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        if not torch.cuda.is_available():
            return False, "no CUDA device is visible to torch"
        return True, ""

    def describe(self) -> dict:
        p = self.plan
        path = ({"tile_docs": self._tiled.tiles.tile,
                 "single_query_graph": self._tiled.graphs is not None} if self._tiled is not None
                else {"topk": self.topk})
        return {"backend": self.name, "device": str(self.device), "scorer": self.scorer,
                "term_order": self.term_order, **path,
                "budget_bytes": p.budget, "index_bytes_on_device": p.index_bytes, "norms_bytes": p.norms_bytes,
                "resident_shards": len(p.resident), "streamed_shards": len(p.streamed),
                "resident_shard_bytes": p.resident_bytes, "staging_bytes": p.staging_bytes,
                "query_tables_bytes": p.table_bytes,
                "batch_rows": p.rows, "accumulator_bytes": p.rows * p.row_bytes, "total_bytes": p.total_bytes}

    # -- search -------------------------------------------------------------------------------
    def _cache(self, k1: float, b: float, avgdl: float | None = None) -> tuple[np.ndarray, torch.Tensor, float]:
        """The norm cache of (k1, b) and ``avgdl`` (default the index's) on the host and the device, and its
        ``_min_q``."""
        got = self._caches.get((k1, b, avgdl))  # as given first: the f32 rounding costs a single query ~1 us
        if got is not None:
            return got
        a = self.index.avgdl if avgdl is None else np.float32(avgdl)
        key = (float(np.float32(k1)), float(np.float32(b)), float(a))
        if key not in self._caches:
            if len(self._caches) > 64:  # a live index's avgdl changes at every refresh: keep a bounded few
                self._caches.clear()
            c = bm25.norm_cache(k1, b, a)
            self._caches[key] = (c, torch.from_numpy(c).to(self.device), self._min_q(c))
        got = self._caches[(k1, b, avgdl)] = self._caches[key]
        return got

    def _min_q(self, cache_np: np.ndarray) -> float:
        """``bm25.sum_is_exact``'s bound: tf >= 1 and norm <= the largest bound tf * cache[norm] below; /4 keeps a
        margin for the f32 rounding of a term's score."""
        return float(cache_np[self._max_norm]) / 4

    def search_terms(self, queries: list[QueryTerms], k: int, k1: float, b: float,
                     times: StageTimes | None = None, avgdl: float | None = None) -> list[TopK]:
        if self._tiled is not None and self._tiled.takes_one(queries):
            return [self._search_one(queries[0], k, k1, b, times, avgdl)]
        todo = [i for i, q in enumerate(queries) if len(q)]
        empty = TopK(np.zeros(0, np.int64), np.zeros(0, np.float32)) if len(todo) < len(queries) else None
        results: list[TopK] = [empty] * len(queries)
        chunks = [todo[c:c + self.plan.rows] for c in range(0, len(todo), self.plan.rows)]
        with self._on_device():
            _, cache, min_q = self._cache(k1, b, avgdl)
            batches = [[queries[i] for i in idx] for idx in chunks]
            if self._tiled is not None:
                found = self._tiled.search(batches, k, cache, min_q, times)
            else:
                found = self._dense.search(batches, k, cache, min_q, times)
            for idx, tops in zip(chunks, found):
                for i, t in zip(idx, tops):
                    results[i] = t
        return results

    def _search_one(self, query: QueryTerms, k: int, k1: float, b: float, times: StageTimes | None,
                    avgdl: float | None = None) -> TopK:
        """A query the device plans, as one graph launch (``TiledPath.search_one``), on the backend's device."""
        if not self._is_current():
            with torch.cuda.device(self.device):
                return self._search_one(query, k, k1, b, times, avgdl)
        _, cache, min_q = self._cache(k1, b, avgdl)
        return self._tiled.search_one(query, k, cache, min_q, times)

    def device_arrays(self) -> dict:
        """The device arena (read-only use): postings, blk_id, blk_start, norms, each shard's base offsets into
        them (resident shards only) and the item planner, for baselines that want the data without a 2nd copy."""
        a = self._arena
        return {"postings": a.post, "blk_id": a.bid, "blk_start": a.bst, "norms": a.norms,
                "posting_base": a.pbase, "entry_base": a.ebase, "resident": self.plan.resident,
                "planner": self._planner}

    def close(self) -> None:
        self._tiled = self._dense = None
        self._arena.close()
        self._caches.clear()
