"""The GPU backend's two search paths over its ``DeviceArena``, each from a batch of queries to their top-k lists.

- ``TiledPath`` (scorers ``cuda`` and ``triton``): batches in a pipeline, where the host plans batch n + 1 and
  queues it behind batch n's selection, then ranks batch n's candidates while the device scores batch n + 1; a
  single query the device plans is one CUDA graph launch (``graphs.QueryGraphs``).
- ``DensePath`` (scorer ``torch``, the reference): a dense f64 accumulator of shape [queries, num_docs], scored by
  work items one launch per term position where the f64 sums depend on the order (``relevancy.score_torch``), then
  ``selection.select_topk``.
"""
from __future__ import annotations

import functools
import time

import numpy as np
import torch

from indexer import bm25
from indexer.bm25 import QueryTerms
from ragserve.kernels.contract import StageTimes, TopK
from ragserve.kernels.gpu.graphs import QueryGraphs
from ragserve.kernels.gpu.memory import DeviceArena, MemoryPlan
from ragserve.kernels.gpu.planning import ItemPlanner, Items, flat_shift, plan_queries, plan_tiles
from ragserve.kernels.gpu.relevancy import TileScorer, score_torch
from ragserve.kernels.gpu.selection import TileSelector, select_topk


class TiledPath:
    """Scoring by doc tiles on chip (``relevancy.TileScorer``) and selection from their maxima
    (``selection.TileSelector``). ``term_order``: ``auto`` lets the CUDA kernel add a query's terms all at once
    where its f64 sum is exact in any order (``flat_shift``), ``ascending`` never."""

    def __init__(self, tiles: TileScorer, selector: TileSelector, graphs: QueryGraphs | None, arena: DeviceArena,
                 planner: ItemPlanner, plan: MemoryPlan, n_blocks: int, term_order: str, cuda: bool) -> None:
        self.tiles = tiles
        self.selector = selector
        self.graphs = graphs  # single queries as one graph launch, where the device plans them
        self.arena = arena
        self.planner = planner
        self.plan = plan
        self.n_blocks = n_blocks
        self.term_order = term_order
        self.cuda = cuda

    def takes_one(self, queries: list[QueryTerms]) -> bool:
        """Is this a single query for the graph path (one the device plans)? Timing never changes the answer."""
        return len(queries) == 1 and self.graphs is not None and self.tiles.plans_on_device(queries[0])

    def search_one(self, query: QueryTerms, k: int, cache: torch.Tensor, min_q: float,
                   times: StageTimes | None) -> TopK:
        """A query the device plans, as one graph launch (``graphs.QueryGraphs``) with none of a batch's bookkeeping:
        a single query's latency is mostly host work (H200 host: ~10 us of it went to the batch path's). ``times``
        gains the graph's own scoring time (its events) as relevancy, the rest of the call as retrieval."""
        t0 = time.perf_counter() if times is not None else 0.0
        shift = self.shift(query, min_q)
        self.tiles.begin(1)
        self.graphs.launch(query, shift, self.arena.post, self.arena.norms, cache, k)
        tops, _ = self.selector.finish(lambda: self.launch_chunk((1, query, None, shift), cache, k))
        if times is not None:  # a rescored query's second scoring counts as retrieval: rare, and in no graph
            relevancy = self.graphs.relevancy_seconds()
            times.relevancy += relevancy
            times.retrieval += max(0.0, time.perf_counter() - t0 - relevancy)
        return tops[0]

    def search(self, batches: list[list[QueryTerms]], k: int, cache: torch.Tensor, min_q: float,
               times: StageTimes | None) -> list[list[TopK]]:
        """Batches in a pipeline: while the device scores batch n, the host plans batch n + 1 and queues it
        behind batch n's selection, then ranks batch n's candidates while the device scores batch n + 1."""
        if not batches:
            return []
        t_start = time.perf_counter()
        timed = times is not None and self.cuda  # device scoring time from events: no synchronisation added
        scored, host_scoring = [], [0.0]  # (start, end) event pairs of the launches; or their host time
        selector, out = self.selector, []

        def launch(chunk) -> None:
            t = time.perf_counter()
            if timed:
                scored.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                scored[-1][0].record()
            self.launch_chunk(chunk, cache, k)
            if timed:
                scored[-1][1].record()
            host_scoring[0] += time.perf_counter() - t  # the scoring itself where kernels run on the host

        cur = self.plan_chunk(batches[0], min_q)
        launch(cur)
        for n in range(len(batches)):
            selector.start(len(batches[n]), k)
            nxt = None
            if n + 1 < len(batches):
                nxt = self.plan_chunk(batches[n + 1], min_q)
                launch(nxt)  # queued behind this batch's selection
            tops, rescored = selector.finish(functools.partial(launch, cur))
            if rescored and nxt is not None:
                launch(nxt)  # scoring this batch again overwrote the next one's
            out.append(tops)
            cur = nxt
        if times is not None:  # relevancy: the scoring; topk: the rest (planning, selection, ranking)
            relevancy = sum(a.elapsed_time(b) for a, b in scored) / 1e3 if timed else host_scoring[0]
            times.relevancy += relevancy
            times.retrieval += max(0.0, time.perf_counter() - t_start - relevancy)
        return out

    def plan_chunk(self, queries: list[QueryTerms], min_q: float) -> tuple:
        """Host work of a batch, (rows, plan, streamed items, shifts): the resident shards' plan, with the queries'
        shifts of the CUDA kernel's flat path (``shifts``), and the streamed shards' items (planned when staged)
        and shifts. A single query the device plans is its own plan, with its shift."""
        if len(queries) == 1 and self.tiles.plans_on_device(queries[0]):  # planned by the scoring launch
            return 1, queries[0], None, self.shift(queries[0], min_q)
        if not self.plan.streamed:  # one compiled call from the queries to the plan
            plan = plan_queries(self.planner, queries, self.arena.pbase, self.n_blocks, self.term_order == "auto",
                                min_q)
            return len(queries), plan, None, np.zeros(0, np.int64)
        items = self.planner.items(queries)
        shifts = self.shifts(queries, min_q)
        streamed = np.isin(items.shard, self.plan.streamed)
        resident = items.take(~streamed)
        return len(queries), plan_tiles(self.planner, resident, self.arena.pbase[resident.shard],
                                        self.n_blocks, shifts), items.take(streamed), shifts

    def launch_chunk(self, chunk: tuple, cache: torch.Tensor, k: int) -> None:
        """Queue the scoring of a planned batch (``plan_chunk``), staging each streamed shard in turn."""
        rows, plan, streamed, shifts = chunk
        tiles, arena = self.tiles, self.arena
        tiles.begin(rows)
        if isinstance(plan, QueryTerms):
            tiles.score_query(plan, shifts, arena.post, arena.norms, cache, k)
            return
        tiles.score(plan, arena.post, arena.norms, cache, k)
        for s in self.plan.streamed:
            part = streamed.take(streamed.shard == s)
            if len(part):
                pbase, _ = arena.stage(s, part, tiles.sample)
                tiles.score(plan_tiles(self.planner, part, pbase, self.n_blocks, shifts), arena.post,
                            arena.norms, cache, k)

    def shift(self, query: QueryTerms, min_q: float) -> int:
        """The CUDA kernel's flat path for one query: its ``flat_shift`` (0: its terms one after the other; always
        with ``term_order='ascending'``)."""
        return flat_shift(query.weights, min_q) if self.term_order == "auto" else 0

    def shifts(self, queries: list[QueryTerms], min_q: float) -> np.ndarray:
        """``shift`` of each query."""
        return np.array([self.shift(q, min_q) for q in queries], dtype=np.int64)


class DensePath:
    """Scoring into dense f64 rows of [queries, num_docs] (the memory plan's batch of them) with torch ops on any
    device; ``term_order`` as ``TiledPath``'s, ``topk`` the selection (``selection.METHODS``)."""

    def __init__(self, arena: DeviceArena, planner: ItemPlanner, plan: MemoryPlan, num_docs: int, tf_bits: int,
                 block_shift: int, device: torch.device, term_order: str, topk: str) -> None:
        self.arena = arena
        self.planner = planner
        self.plan = plan
        self.num_docs = num_docs
        self.tf_bits = tf_bits
        self.block_shift = block_shift
        self.device = device
        self.term_order = term_order
        self.topk = topk
        self._acc: torch.Tensor | None = None

    def search(self, batches: list[list[QueryTerms]], k: int, cache: torch.Tensor, min_q: float,
               times: StageTimes | None) -> list[list[TopK]]:
        """Each batch scored, then its top-k selected (with ``times``, the device is waited for between them)."""
        out = []
        for qs in batches:
            t0 = time.perf_counter()
            acc = self.accumulate(qs, cache, min_q)
            if times is not None:
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                t1 = time.perf_counter()
            out.append(select_topk(acc, k, self.topk))
            if times is not None:
                times.relevancy += t1 - t0
                times.retrieval += time.perf_counter() - t1
        return out

    def accumulate(self, queries: list[QueryTerms], cache: torch.Tensor, min_q: float) -> torch.Tensor:
        """Score up to ``plan.rows`` queries into accumulator rows [0, len(queries)); returns that view."""
        acc = self._accumulator(len(queries))
        exact = self._exact(queries, min_q)
        self._by_shard(self.planner.items(queries),
                       lambda part, pbase, e0: self._launch_all(part, pbase, e0, exact, cache, acc))
        return acc

    def _accumulator(self, rows: int) -> torch.Tensor:
        if self._acc is None or self._acc.shape[0] < rows:
            self._acc = torch.zeros((max(rows, self.plan.rows), self.num_docs), dtype=torch.float64,
                                    device=self.device)
        return self._acc[:rows]

    def _exact(self, queries: list[QueryTerms], min_q: float) -> np.ndarray:
        """Per query: may its f64 sums be formed in any order (``bm25.sum_is_exact``; never with
        ``term_order='ascending'``)."""
        if self.term_order != "auto":
            return np.zeros(len(queries), dtype=bool)
        return np.array([bm25.sum_is_exact(q.weights, min_q) for q in queries], dtype=bool)

    def _by_shard(self, items: Items, launch) -> None:
        """``launch(items, posting base, first entry in the arena)`` for the resident shards' items at once,
        then for each streamed shard's items once they are staged."""
        streamed = np.isin(items.shard, self.plan.streamed)
        resident = items.take(~streamed)
        if len(resident):
            launch(resident, self.arena.pbase[resident.shard], self.arena.ebase[resident.shard] + resident.e0)
        for s in self.plan.streamed:
            part = items.take(items.shard == s)
            if len(part):
                pbase, e0 = self.arena.stage(s, part)
                launch(part, pbase, e0)

    def _launch_all(self, items: Items, pbase: np.ndarray, e0: np.ndarray, exact: np.ndarray,
                    cache: torch.Tensor, acc: torch.Tensor) -> None:
        """Exact rows in one launch (their sums do not depend on the order); the others one launch per term
        position, ascending."""
        if len(items) == 0:
            return
        is_exact = exact[items.row]
        self._launch(items, pbase, e0, is_exact, cache, acc)
        rest = ~is_exact
        if rest.any():
            for j in range(int(items.slot[rest].max()) + 1):
                self._launch(items, pbase, e0, rest & (items.slot == j), cache, acc)

    def _launch(self, items: Items, pbase: np.ndarray, e0: np.ndarray, sel: np.ndarray,
                cache: torch.Tensor, acc: torch.Tensor) -> None:
        if not sel.any():
            return
        it = items.take(sel)
        args = (it.a, it.n, e0[sel], it.ne, pbase[sel], it.row * self.num_docs, it.w)
        a = self.arena
        tail = (a.post, a.bid, a.bst, a.norms, cache, acc.view(-1), self.tf_bits, self.block_shift)
        score_torch(*(torch.from_numpy(np.ascontiguousarray(x)).to(self.device) for x in args), *tail)
