"""A single query as one CUDA graph launch: its copy to the device, plan, scoring, selection and read-back, captured
once for each k and norm cache and replayed for any query the device plans (``TileScorer.plans_on_device``). A single
query's dozen launches cost the host tens of microseconds, and the device waited on them; this is the path every
single query the device plans takes, whether or not stage times are asked for.

The graph also records two timing events, before the plan and between the scoring and the selection kernels: the
scoring's device time (the relevancy stage) is read from them once the query is done, with no synchronisation added.
"""
from __future__ import annotations

import torch

from indexer.bm25 import QueryTerms
from ragserve.kernels.gpu.relevancy import TileScorer
from ragserve.kernels.gpu.selection import TileSelector
from ragserve.kernels.gpu.settings import GpuSettings


class QueryGraphs:
    """The captured graphs of a ``TileScorer`` with query tables and its ``TileSelector`` (CUDA kernels and copies)."""

    def __init__(self, scorer: TileScorer, selector: TileSelector, settings: GpuSettings) -> None:
        self.scorer, self.selector, self.settings = scorer, selector, settings
        copies = scorer.copies
        self._copies = copies
        self._capture = copies.stream()  # graphs are captured on a stream of our own
        self._start, self._scored = copies.event(timing=True), copies.event(timing=True)
        # (k, id of the norm cache tensor) -> graph, the found and listed buffers it writes, the cache, and ``started``
        self._graphs: dict[tuple[int, int], tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, tuple]] = {}

    def launch(self, query: QueryTerms, shift: int, post: torch.Tensor, norms: torch.Tensor, cache: torch.Tensor,
               k: int) -> None:
        """``TileScorer.score_query`` and ``TileSelector.start(1, k)`` (after ``scorer.begin(1)``) as one launch of the
        graph for (k, cache), captured at its first use; ``selector.finish`` as usual."""
        sc, sel = self.scorer, self.selector
        key = (k, id(cache))  # the cache tensor is kept in the entry (a tensor's own hash costs ~0.4 us)
        got = self._graphs.get(key)
        if got is None or got[1] is not sel.found or got[2] is not sc.listed or got[3] is not cache:
            if got is not None:  # its buffers moved (or another cache took the id)
                self._copies.drop_graph(got[0])
            elif len(self._graphs) >= self.settings.max_graphs:
                self._copies.drop_graph(self._graphs.pop(next(iter(self._graphs)))[0])
            capacity = sel.capacity(1, k)
            sel.found_room(capacity)  # allocated before the capture, which fixes their addresses
            sc.listed_room(sc.n_blocks * sc.tpb)
            graph = self._capture_query(post.data_ptr(), norms, cache, k, capacity)
            got = self._graphs[key] = (graph, sel.found, sc.listed, cache,
                                       (1, k, capacity, sel.peek(1, k, capacity), True))
        sc.set_query(query, shift)
        self._copies.launch_graph(got[0], sc.stream)
        sc.cleared()  # its collect cleared the maxima
        sel.started = got[4]

    def _capture_query(self, post: int, norms: torch.Tensor, cache: torch.Tensor, k: int, capacity: int) -> int:
        sc, sel, copies, capture = self.scorer, self.selector, self._copies, self._capture

        def queue() -> None:
            copies.record_in_graph(self._start, capture)
            sc.queue_query(post, norms, cache, k)
            copies.record_in_graph(self._scored, capture)
            sel.queue(1, k, capacity)
            copies.record_in_graph(sel.head_back, capture)  # the graph says when it is done: one driver call less

        stream, sc.stream = sc.stream, capture
        try:
            return copies.capture(capture, queue)
        finally:
            sc.stream = stream

    def relevancy_seconds(self) -> float:
        """Device seconds of the last launched graph's plan and scoring (after ``selector.finish``)."""
        return self._copies.elapsed(self._start, self._scored)
