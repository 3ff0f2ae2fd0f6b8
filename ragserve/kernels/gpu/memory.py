"""Device memory plan of the GPU backend: which shards live on the device, which stream from host memory.

A shard on the device holds its layout arrays as they are: ``postings.u32`` (4 bytes a posting) and
``blk_id.u32`` / ``blk_start.u32`` (4 bytes an entry each, plus one sentinel); the CUDA tile kernels add samples of
the postings (``posting_extra`` bytes a posting: 1/32). The other per-shard tables
(``term_ptr``, block bounds) stay on the host, where work items are planned; where every shard fits, the tiled CUDA
path also keeps every shard's ``term_ptr`` on the device (``table_bytes``) to plan single queries there. Besides the
shards the device needs the norms (1 byte a doc) and, per query scored at once, a row of per-doc working memory: on
the dense path an f64 accumulator plus the top-k working set (``ROW_BYTES_PER_DOC``), on the tiled path kept f32
scores and group maxima; the tiled path also has fixed per-program scratch (``work_bytes``). Shards that do not fit
are copied, the slices a batch needs, into a staging area as large as the largest such shard.

``DeviceArena`` carries a plan out: it holds the index on the device (residency) and stages the streamed shards.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from indexer.reader import IndexReader
from ragserve.kernels.contract import SearchError
from ragserve.kernels.gpu.planning import Items

# Per doc and accumulator row: f64 accumulator (8), f32 scores (4), three bool masks (3), top-k scratch (4).
ROW_BYTES_PER_DOC = 19


class MemoryPlanError(SearchError):
    """Not even one accumulator row, the norms and the staging area fit in the memory budget."""


def shard_device_bytes(postings: int, entries: int, posting_extra: float = 0.0) -> int:
    return 4 * postings + math.ceil(posting_extra * postings) + 8 * (entries + 1)


@dataclass(frozen=True)
class MemoryPlan:
    budget: int
    norms_bytes: int
    resident: tuple[int, ...]  # shard indexes kept on the device
    streamed: tuple[int, ...]  # shard indexes staged from host memory per batch
    resident_bytes: int
    staging_postings: int  # capacity of the staging area, postings
    staging_entries: int  # capacity of the staging area, entries (with the staged terms' end sentinels)
    rows: int  # queries scored at once
    row_bytes: int
    work_bytes: int = 0  # scoring scratch, whatever the batch
    table_bytes: int = 0  # device tables single queries are planned from (planning.QueryTables)
    posting_extra: float = 0.0  # device bytes a posting beside its 4 (the CUDA kernels' samples)

    @property
    def staging_bytes(self) -> int:
        return (shard_device_bytes(self.staging_postings, self.staging_entries - 1, self.posting_extra)
                if self.streamed else 0)

    @property
    def index_bytes(self) -> int:
        """Bytes the index itself occupies on the device (norms + resident shards + staging + query tables)."""
        return self.norms_bytes + self.resident_bytes + self.staging_bytes + self.table_bytes

    @property
    def total_bytes(self) -> int:
        return self.index_bytes + self.work_bytes + self.rows * self.row_bytes


def plan_memory(num_docs: int, shards: list[tuple[int, int]], budget: int, max_rows: int,
                row_bytes: int | None = None, work_bytes: int = 0, table_bytes: int = 0,
                posting_extra: float = 0.0) -> MemoryPlan:
    """Place shards (``(postings, entries)`` each) within ``budget`` bytes, leaving room for >= 1 row.

    ``row_bytes`` is the device memory per query of a batch (the dense path's ``ROW_BYTES_PER_DOC`` per doc
    by default), ``work_bytes`` what the scoring needs whatever the batch, ``table_bytes`` tables kept beside the
    shards (counted like the working memory), ``posting_extra`` bytes a posting beside its 4 (resident or staged).
    Shards are kept resident in index order as long as they fit; the rest
    stream. Raises ``MemoryPlanError`` when not even the norms, one row,
    the working memory and the staging area fit.
    """
    if max_rows < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_rows}")
    if row_bytes is None:
        row_bytes = ROW_BYTES_PER_DOC * num_docs
    fixed = num_docs + row_bytes + work_bytes + table_bytes
    sizes = [shard_device_bytes(p, e, posting_extra) for p, e in shards]
    if fixed + sum(sizes) <= budget:
        resident, streamed = tuple(range(len(shards))), ()
        stage_p = stage_e = 0
    else:
        stage_p = max(p for p, _ in shards)
        # Staged terms each carry their end sentinel: at most one per entry (a term has >= 1 entry).
        stage_e = 2 * max(e for _, e in shards)
        stage = shard_device_bytes(stage_p, stage_e - 1, posting_extra)
        room = budget - fixed - stage
        if room < 0:
            raise MemoryPlanError(
                f"the GPU backend needs at least {fixed + stage:,} bytes of device memory (norms {num_docs:,}, "
                f"one query row {row_bytes:,}, scoring work {work_bytes:,}, tables {table_bytes:,}, staging for the "
                f"largest shard {stage:,}); the budget is {budget:,} bytes: free device memory or raise memory_bytes")
        res = []
        for i, size in enumerate(sizes):
            if size <= room:
                res.append(i)
                room -= size
        resident = tuple(res)
        streamed = tuple(i for i in range(len(shards)) if i not in res)
    resident_bytes = sum(sizes[i] for i in resident)
    staging = shard_device_bytes(stage_p, stage_e - 1, posting_extra) if streamed else 0
    spare = budget - num_docs - work_bytes - table_bytes - resident_bytes - staging
    rows = max(1, min(max_rows, spare // row_bytes)) if row_bytes else max_rows
    return MemoryPlan(budget=budget, norms_bytes=num_docs, resident=resident, streamed=streamed,
                      resident_bytes=resident_bytes, staging_postings=stage_p, staging_entries=stage_e,
                      rows=int(rows), row_bytes=row_bytes, work_bytes=work_bytes, table_bytes=table_bytes,
                      posting_extra=posting_extra)


class DeviceArena:
    """The index on the device, as ``plan`` places it: the resident shards' ``postings``, ``blk_id`` and
    ``blk_start`` concatenated into one arena each (``post``, ``bid``, ``bst``; shard i from ``pbase[i]`` and
    ``ebase[i]``), the norms, and after the resident shards the staging area that a streamed shard's slices are
    copied into for each batch (``stage``). Uploads go through a pinned buffer of ``bounce_elems`` words."""

    def __init__(self, index: IndexReader, plan: MemoryPlan, device: torch.device, bounce_elems: int) -> None:
        self.index, self.plan, self.device = index, plan, device
        self._cuda = device.type == "cuda"
        shards = index.shards
        self.pbase = np.zeros(len(shards), np.int64)
        self.ebase = np.zeros(len(shards), np.int64)
        p_off = e_off = 0
        for i in plan.resident:
            self.pbase[i], self.ebase[i] = p_off, e_off
            p_off += shards[i].postings.size
            e_off += shards[i].blk_id.size + 1
        self.stage_p, self.stage_e = p_off, e_off  # staging lives after the resident shards
        self.post = torch.empty(p_off + plan.staging_postings, dtype=torch.int32, device=device)
        self.bid = torch.empty(e_off + plan.staging_entries, dtype=torch.int32, device=device)
        self.bst = torch.empty(e_off + plan.staging_entries, dtype=torch.int32, device=device)
        self._bounce = torch.empty(bounce_elems, dtype=torch.int32, pin_memory=True) if self._cuda else None
        for i in plan.resident:
            sh, p0, e0 = shards[i], int(self.pbase[i]), int(self.ebase[i])
            self._upload(self.post, p0, sh.postings)
            self._upload(self.bid, e0, sh.blk_id)
            self._upload(self.bst, e0, sh.blk_start)
        if plan.streamed and self._cuda:
            self._stage_host = [torch.empty(n, dtype=torch.int32, pin_memory=True)
                                for n in (plan.staging_postings, plan.staging_entries, plan.staging_entries)]
        self.norms = torch.from_numpy(np.array(np.asarray(index.norms), dtype=np.uint8)).to(device)
        if self._cuda:
            torch.cuda.synchronize(device)

    def _upload(self, dst: torch.Tensor, offset: int, src: np.ndarray) -> None:
        """Copy a (memory-mapped) u32 layout array into ``dst[offset:]``."""
        src = np.asarray(src).view(np.int32)
        if not self._cuda:
            dst[offset:offset + src.size].numpy()[:] = src
            return
        bounce, step = self._bounce.numpy(), self._bounce.numel()
        for o in range(0, src.size, step):
            m = min(step, src.size - o)
            bounce[:m] = src[o:o + m]
            dst[offset + o:offset + o + m].copy_(self._bounce[:m])  # synchronous: the buffer is reused next

    def stage(self, s: int, items: Items,
              staged: Callable[[torch.Tensor, int, int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Copy the postings and entries the items need from host shard ``s`` into the staging area, then call
        ``staged(post, first, count)`` on the staged postings (the CUDA kernels' samples).

        Returns each item's posting base and first-entry index in the arena. Each term is copied once.
        """
        sh = self.index.shards[s]
        terms, first = np.unique(items.term, return_index=True)
        a, n, e0, ne = items.a[first], items.n[first], items.e0[first], items.ne[first]
        sp = np.cumsum(n) - n  # staging offsets of each term's postings
        se = np.cumsum(ne + 1) - (ne + 1)  # and of its entries (with their end sentinel)
        p_host, e_host = self._stage_buffers()
        bid_host = e_host[1]
        for t in range(terms.size):
            p_host[sp[t]:sp[t] + n[t]] = np.asarray(sh.postings[a[t]:a[t] + n[t]]).view(np.int32)
            e_host[0][se[t]:se[t] + ne[t] + 1] = np.asarray(sh.blk_start[e0[t]:e0[t] + ne[t] + 1]).view(np.int32)
            bid_host[se[t]:se[t] + ne[t]] = np.asarray(sh.blk_id[e0[t]:e0[t] + ne[t]]).view(np.int32)
        np_, ne_ = int(n.sum()), int((ne + 1).sum())
        self._copy_stage(self.post, self.stage_p, 0, np_)
        if staged is not None:
            staged(self.post, self.stage_p, np_)
        self._copy_stage(self.bst, self.stage_e, 1, ne_)
        self._copy_stage(self.bid, self.stage_e, 2, ne_)
        pos = np.searchsorted(terms, items.term)
        pbase = self.stage_p + sp[pos] - items.a
        return pbase, self.stage_e + se[pos]

    def _stage_buffers(self) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        if self._cuda:
            torch.cuda.synchronize(self.device)  # the previous shard's copies must have left the pinned buffers
            h = self._stage_host
            return h[0].numpy(), (h[1].numpy(), h[2].numpy())
        # On the CPU the staging area itself is host memory: write into it directly.
        return (self.post[self.stage_p:].numpy(),
                (self.bst[self.stage_e:].numpy(), self.bid[self.stage_e:].numpy()))

    def _copy_stage(self, dst: torch.Tensor, offset: int, which: int, count: int) -> None:
        if self._cuda:
            dst[offset:offset + count].copy_(self._stage_host[which][:count], non_blocking=True)

    def close(self) -> None:
        self.post = self.bid = self.bst = self.norms = None
