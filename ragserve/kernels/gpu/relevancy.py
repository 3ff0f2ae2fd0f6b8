"""GPU relevancy stage: BM25 scores of a batch's doc tiles (the tiled path), or of dense accumulator rows (the torch
reference path).

Tiled path (``TileScorer``). The doc space is cut into tiles of ``tile`` docs inside the layout's doc blocks; a
(query, tile) unit is scored on chip into the tile's f64 cells, in the canonical term order of ``indexer/FORMAT.md``
(or as exact fixed-point sums where the order cannot matter: ``planning.flat_shift``), so no f64 accumulator row ever
goes to device memory. From a tile the kernels write the f32 maximum of each 32-doc group and the f32 scores of the
groups that can hold one of the tile's k best docs; ``selection`` reads them. The device traffic is the postings, the
norms they touch, and 4 bytes per matched doc plus the group maxima, instead of a dense f64 row's 16 bytes per posting
and 24 per doc.

On CUDA the kernels are ``cuda/relevancy.cu``'s (the tile in shared memory, 2.2x faster), where NVRTC can be loaded;
``triton/relevancy.py``'s is the fallback and the version CI runs under Triton's interpreter. Where a launch has enough
units, the CUDA scorer first scores a sample of them (``sample_step``): the k-th largest of a row's sampled tile maxima
is reached by k docs. Where few tiles can reach that threshold (``filters``), a 2-byte pass over every unit (two tiles
a block in half the f64 tile's shared memory, so more blocks a multiprocessor) bounds each tile's maximum from above
and lists the units that may reach it; only they are scored in f64 and read out. Otherwise every unit is scored.
Either way a tile whose maximum falls below the threshold writes nothing. Every CUDA scoring launch also raises a
running threshold from its own finished tiles' maxima: at large k, where no sample pays, later tiles skip their
read-out by it. Where each term's postings for a tile begin is found first, for all (entry, tile) pairs at once
(``tile_bounds``); the scoring kernel then walks contiguous posting ranges.

A single query of up to ``QMAX`` terms is planned on the device (``plan_single``, from ``planning.QueryTables``), so
its scoring needs no host plan or upload (``score_query``); ``graphs`` replays it with the selection as one launch.

Dense path (``score_torch``, any device): each posting adds ``f64(s)`` into ``acc[row * num_docs + doc]``; the caller
orders launches so that every cell sums in the canonical order unless the query's f64 sums are exact in any order.

Dense vectors (``inner_product``, torch, any device): inner products of queries against keys.
"""
from __future__ import annotations

import numpy as np
import torch

from indexer.bm25 import QueryTerms
from ragserve.kernels.gpu.cuda import kernels as CK
from ragserve.kernels.gpu.cuda.kernels import TileKernels
from ragserve.kernels.gpu.cuda.rtc import StreamCopies, current_stream
from ragserve.kernels.gpu.planning import QueryTables, TilePlan, tile_size
from ragserve.kernels.gpu.settings import GpuSettings
# The Triton kernels themselves are imported where they launch: only where Triton imports (torch's CPU wheel ships
# without it).
from ragserve.kernels.gpu.triton import programs

GROUP = 32  # docs a group maximum: the CUDA kernels' warp-wide read-out is built on it (a group never straddles tiles)
M32 = 0xFFFFFFFF


def sample_step(n_units: int, rows: int, k: int, settings: GpuSettings) -> int:
    """Every how many units the CUDA scorer's sample takes (0: no sample). With m of a row's u units sampled, a
    fraction of about k / m of the others reach the sample's threshold and are read out; m + u * k / m is least at
    m = sqrt(u * k), a step of sqrt(u / k). Odd, so it meets every tile of a block (their number is a power of two).
    Under ``sample_min_units`` units only where the filter runs (``filters``)."""
    if rows == 0 or settings.sample_scale <= 0:
        return 0
    step = int(settings.sample_scale * (n_units / rows / k) ** 0.5)
    step = step | 1 if step >= settings.min_sample_step else 0
    return step if step and (n_units >= settings.sample_min_units or filters(n_units, rows, k, step, settings)) else 0


def filters(n_units: int, rows: int, k: int, step: int, settings: GpuSettings) -> bool:
    """Does a sampled launch run the filter: are at most 1 / ``filter_ratio`` of a row's units expected to reach the
    sample's threshold (k / m of them, m sampled)?"""
    return settings.filter_ratio * k <= n_units // rows // step


def cuda_parts(tile: int, tpb: int, device: torch.device, settings: GpuSettings,
               scorer: str) -> tuple[TileKernels | None, StreamCopies | None]:
    """What the tiled path drives CUDA with on ``device``: the CUDA C kernels for ``scorer="cuda"``, compiled now
    (``RtcError`` where NVRTC cannot; None for Triton's scorer, and where they cannot run: off CUDA, tiles under a
    group), and the driver's copies, events and graphs (None off CUDA)."""
    if device.type != "cuda":
        return None, None
    kernels = TileKernels.build(tile, tpb, device, settings) if scorer == "cuda" and tile >= GROUP else None
    return kernels, StreamCopies()


class TileScorer:
    """Device buffers and scoring launches of the tiled path for one index. One caller at a time (the gpu backend's
    searches are serialised): buffers and launch arguments are reused. ``selection.TileSelector`` reads what it writes
    (``maxima``, ``tile_maxima``, ``scores``, ``running``) and clears it; ``kernels`` and ``copies`` come from
    ``cuda_parts``."""

    def __init__(self, num_docs: int, block_size: int, tf_bits: int, max_rows: int, device: torch.device,
                 settings: GpuSettings, kernels: TileKernels | None = None, copies: StreamCopies | None = None) -> None:
        self.num_docs, self.block_size, self.tf_bits = num_docs, block_size, tf_bits
        self.settings = settings
        self.tile = tile_size(block_size, settings.tile_max)
        self.tpb = block_size // self.tile
        self.group = min(GROUP, self.tile)  # a group never straddles tiles
        self.n_groups = (num_docs + self.group - 1) // self.group
        self.device = device
        self._pinned = device.type == "cuda"  # host buffers the driver copies from or to
        self.n_tiles = (num_docs + self.tile - 1) // self.tile
        self.n_blocks = -(-num_docs // block_size)
        # Zero at rest: the collect kernel clears what it reads, so no batch starts by zeroing them.
        self.maxima = torch.zeros((max_rows, self.n_groups), dtype=torch.float32, device=device)
        self.tile_maxima = torch.zeros((max_rows, self.n_tiles), dtype=torch.float32, device=device)
        self._dirty = 0  # rows scored and not cleared by a collect (an interrupted search)
        self.scores = torch.empty((max_rows, num_docs), dtype=torch.float32, device=device)
        self.theta = torch.zeros(max_rows, dtype=torch.float32, device=device)  # the sample's thresholds
        self._no_theta = torch.zeros(max_rows, dtype=torch.float32, device=device)
        self.listed = torch.zeros(2, dtype=torch.int32, device=device)  # the filter's count and units
        # the CUDA scorer's running thresholds (zero at rest: the collect kernel clears a row's)
        self.running = torch.zeros((max_rows, CK.RUN_WORDS), dtype=torch.int32, device=device)
        self._fixed_ptrs = tuple(t.data_ptr() for t in (self.maxima, self.tile_maxima, self.scores, self.theta,
                                                         self._no_theta, self.running))
        self._table_host: torch.Tensor | None = None  # pinned staging of the plan tables
        self.table_dev: torch.Tensor | None = None
        self.kernels, self.copies = kernels, copies
        self.stream = 0  # the caller's current stream, taken at ``begin``
        self._table_sent = copies.event() if copies is not None else None  # after each plan table's upload
        self.bounds = torch.empty(0, dtype=torch.int32, device=device)
        self._samp: torch.Tensor | None = None  # the CUDA kernels' samples of the arena's postings (``sample``)
        self.query_tables: QueryTables | None = None  # set where single queries are planned on the device
        self.scorer = "cuda" if kernels is not None else "triton"
        self.programs = programs(device, settings.programs_per_sm)
        # The Triton kernel's per-program scratch; the CUDA one keeps its tile in shared memory.
        self.scratch = (torch.zeros(self.programs * self.tile, dtype=torch.float64, device=device)
                        if kernels is None else None)

    @staticmethod
    def sample_bytes_per_posting(tpb: int) -> float:
        """Device bytes the CUDA kernels' samples (``sample``) add to each posting of the arena."""
        return CK.sample_bytes(tpb) / CK.SAMPLE

    def sample(self, post: torch.Tensor, first: int, count: int) -> None:
        """Sample postings [first, first + count) of the arena ``post`` for the CUDA kernels' tile ranges (after
        they are written; on the caller's stream, behind their copy). Nothing to do without those kernels."""
        if self.kernels is None:
            return
        if self._samp is None:
            n = -(-post.numel() // CK.SAMPLE)
            self._samp = torch.zeros(n, dtype=torch.uint8 if CK.sample_bytes(self.tpb) == 1 else torch.int16,
                                     device=self.device)
        i0, i1 = -(-first // CK.SAMPLE), -(-(first + count) // CK.SAMPLE)
        if i1 > i0:
            self.kernels.samples(-(-(i1 - i0) // CK.BOUNDS_THREADS), CK.BOUNDS_THREADS, post.data_ptr(),
                                 self._samp.data_ptr(), i0, i1 - i0, self.tf_bits, stream=current_stream(self.device))

    @staticmethod
    def work_bytes(device: torch.device, tile: int, settings: GpuSettings) -> int:
        """Device bytes of the Triton kernel's per-program scratch (the CUDA one needs none)."""
        return programs(device, settings.programs_per_sm) * tile * 8

    @staticmethod
    def row_bytes(num_docs: int, block_size: int, tile: int) -> int:
        """Device bytes per query of a batch: kept f32 scores, group and tile maxima, the CUDA filter's list of
        units (one entry at most for each tile of each doc block, and its 8-byte count), three f32 thresholds and the
        running threshold's words."""
        group = min(GROUP, tile)
        units = -(-num_docs // block_size) * (block_size // tile)
        maxima = 4 * ((num_docs + group - 1) // group) + 4 * ((num_docs + tile - 1) // tile)
        return 4 * num_docs + maxima + 4 * (units + 2) + 12 + 4 * CK.RUN_WORDS

    def begin(self, rows: int) -> None:
        """Before scoring a batch: clear the maxima an interrupted search left (tiles with no postings leave
        their maxima as they find them)."""
        if self._dirty:
            self.maxima[:self._dirty].zero_()
            self.tile_maxima[:self._dirty].zero_()
            self.running[:self._dirty].zero_()
        self._dirty = rows
        if self.copies is not None:
            self.stream = current_stream(self.device)

    def cleared(self) -> None:
        """The selection's collect has cleared the maxima of every row scored since ``begin``."""
        self._dirty = 0

    def _upload(self, table: np.ndarray) -> torch.Tensor:
        """The plan table on the device (its first ``table.size`` words), through a pinned buffer (an asynchronous
        copy)."""
        if self.copies is None:
            return torch.from_numpy(table)
        n = table.size
        self.copies.wait_event(self._table_sent)  # the previous table has left the pinned buffer
        if self._table_host is None or self._table_host.numel() < n:
            size = max(n, 1 << 16, 2 * (0 if self._table_host is None else self._table_host.numel()))
            self._table_host = torch.empty(size, dtype=torch.int64, pin_memory=self._pinned)
            self.table_dev = torch.empty(size, dtype=torch.int64, device=self.device)
            self._table_np = self._table_host.numpy()
        self._table_np[:n] = table
        self.copies.to_device(self.table_dev.data_ptr(), self._table_host.data_ptr(), 8 * n, self.stream)
        return self.table_dev  # its first n words; the caller records _table_sent after the first launch using it

    def listed_room(self, n_units: int) -> torch.Tensor:
        """The filter's list with room for ``n_units`` units ([0]: the count, 8 bytes cleared by kth)."""
        if self.listed.numel() < 2 + n_units:
            self.listed = torch.empty(max(2 + n_units, 2 * self.listed.numel()), dtype=torch.int32,
                                      device=self.device)
        return self.listed

    def _bounds_room(self, n_ent: int) -> torch.Tensor:
        if self.bounds.numel() < n_ent * self.tpb:
            self.bounds = torch.empty(max(n_ent * self.tpb, 2 * self.bounds.numel()), dtype=torch.int32,
                                      device=self.device)
        return self.bounds

    def score(self, plan: TilePlan, post: torch.Tensor, norms: torch.Tensor, cache: torch.Tensor, k: int) -> None:
        """Score a plan's tiles for a top-``k``: their maxima, and the f32 scores of the groups that matched and
        hold one of the tile's k best docs."""
        n_ent, n_pairs = plan.n_ent, plan.n_pairs
        if n_ent == 0:
            return
        bounds = self._bounds_room(n_ent)
        dev = self._upload(plan.table)
        if self.kernels is not None:
            # Addresses, not tensors or views: a slice, or finding a tensor's pointer at launch, costs microseconds
            # of host time, and a single query waits on them (from the plan's upload to the first launch most).
            ent, post = dev.data_ptr(), post.data_ptr()
            self.kernels.bounds(-(-n_ent * self.tpb // CK.BOUNDS_THREADS), CK.BOUNDS_THREADS, ent, n_ent, post,
                                self._samp.data_ptr(), bounds.data_ptr(), self.tf_bits, stream=self.stream)
            self.copies.record(self._table_sent, self.stream)
            self._score_units(ent, n_ent, ent + 8 * plan.pairs_at, n_pairs, plan.rows, post, norms, cache, k,
                              bounds.data_ptr())
            return
        # The pair columns start 16-byte aligned: Triton compiles a kernel per pointer alignment it sees.
        ent, pairs, n_units = dev[:3 * n_ent], dev[plan.pairs_at:], n_pairs * self.tpb
        # Searches of up to 2^steps postings; rounded up to 8 (extra steps change nothing): few compiled variants.
        steps = -(-(plan.max_count.bit_length() + 1) // 8) * 8
        from ragserve.kernels.gpu.triton.planning import _bounds_kernel
        from ragserve.kernels.gpu.triton.relevancy import _tile_kernel

        _bounds_kernel[(n_ent,)](ent, n_ent, post, bounds, self.tf_bits, TILE=self.tile, TPB=self.tpb, STEPS=steps)
        if self.copies is not None:
            self.copies.record(self._table_sent, self.stream)
        s = self.settings
        # enable_fp_fusion=False: tf * c + 1 must round twice (no FMA), as FORMAT.md's f32 arithmetic does.
        _tile_kernel[(min(n_units, self.programs),)](
            ent, n_ent, pairs, n_pairs, n_units, post, norms, cache, bounds, self.scratch, self.maxima,
            self.tile_maxima, self.scores, self.num_docs, self.n_groups, self.n_tiles, self.tf_bits,
            (1 << self.tf_bits) - 1, self.block_size, self._k_tile(k),
            TILE=self.tile, TPB=self.tpb, GROUP_=self.group, CHUNK_=s.chunk, EB=s.entry_block, num_warps=s.num_warps,
            enable_fp_fusion=False)

    def plans_on_device(self, query: QueryTerms) -> bool:
        """May ``score_query`` plan this query on the device (CUDA kernels, ``set_query_tables`` called, few enough
        terms)?"""
        return self.query_tables is not None and 0 < len(query) <= CK.QMAX

    def set_query_tables(self, tables: QueryTables) -> None:
        """The device tables ``score_query`` plans from (every shard resident), and the buffers of its plan: the
        table's columns ``stride`` = blocks * QMAX entries apart whatever the query, so a graph replays it."""
        if self.kernels is None:
            return
        self.query_tables = tables
        self.stride = self.n_blocks * CK.QMAX
        self.qtable = torch.empty(3 * self.stride + 5 * self.n_blocks, dtype=torch.int64, device=self.device)
        self.qbounds = torch.empty(self.stride * self.tpb, dtype=torch.int32, device=self.device)
        # plan_single's Query: written here by the host, copied to the device by query_in
        self._qhost = torch.zeros(CK.QUERY_WORDS, dtype=torch.int32, pin_memory=self._pinned)
        self._query, self._qhost_dev = self._qhost.numpy(), self.copies.device_address(self._qhost.data_ptr())
        self._query_f32 = self._query.view(np.float32)  # the weights' words
        self._qdev = torch.empty(CK.QUERY_WORDS, dtype=torch.int32, device=self.device)

    def score_query(self, query: QueryTerms, shift: int, post: torch.Tensor, norms: torch.Tensor, cache: torch.Tensor,
                    k: int) -> None:
        """``score`` of one query (``plans_on_device``) planned on the device (``queue_plan``): no host planning or
        upload of a plan on the query's latency path; ``shift``: its ``flat_shift`` (0: its terms one after the
        other)."""
        self.set_query(query, shift)
        self.queue_query(post.data_ptr(), norms, cache, k)

    def set_query(self, query: QueryTerms, shift: int) -> None:
        """The query in the pinned buffer ``query_in`` reads (the previous query's graph or launches are done)."""
        q, nt = self._query, len(query)
        q[0], q[1] = nt, shift
        q[2:2 + nt] = query.term_ids
        self._query_f32[2 + CK.QMAX:2 + CK.QMAX + nt] = query.weights

    def queue_plan(self, post: int) -> None:
        """Queue ``query_in`` and ``plan_single`` of the query set last: its dense plan (every doc block a pair, every
        (block, term) an entry) in ``qtable``, with the tile ranges in ``qbounds``."""
        qt, kn, qdev = self.query_tables, self.kernels, self._qdev.data_ptr()
        kn.query_in(1, 32 * -(-CK.QUERY_WORDS // 32), self._qhost_dev, qdev, stream=self.stream)  # a word a thread
        kn.plan(-(-self.n_blocks * CK.PLAN_TERMS * self.tpb // CK.BOUNDS_THREADS), CK.BOUNDS_THREADS, qdev,
                qt.term_ptr, qt.n_shards, qt.blk_shard, qt.shards, qt.blk_id, qt.blk_start, post, self._samp.data_ptr(),
                self.n_blocks, self.stride, self.qtable.data_ptr(), self.qbounds.data_ptr(), self.tf_bits,
                stream=self.stream)

    def queue_query(self, post: int, norms: torch.Tensor, cache: torch.Tensor, k: int) -> None:
        """``queue_plan`` and the scoring of the query set last."""
        self.queue_plan(post)
        table = self.qtable.data_ptr()
        self._score_units(table, self.stride, table + 24 * self.stride, self.n_blocks, 1, post, norms, cache, k,
                          self.qbounds.data_ptr())

    def _k_tile(self, k: int) -> int:
        """The Triton scorer's cut: groups below the tile's k-th largest group maximum are not written (0: none)."""
        return k if k < self.tile // self.group else 0

    def _score_units(self, ent: int, n_ent: int, pairs: int, n_pairs: int, rows: int, post: int, norms: torch.Tensor,
                     cache: torch.Tensor, k: int, bounds: int) -> None:
        """The CUDA scoring launches of a plan on the device (table at ``ent``, pair columns at ``pairs``, tile ranges
        at ``bounds``)."""
        kn, s = self.kernels, self.settings
        n_units = n_pairs * self.tpb
        norms, cache = norms.data_ptr(), cache.data_ptr()
        maxima, tile_maxima, scores, theta, no_theta, running = self._fixed_ptrs
        running = running if s.running_threshold else 0
        threads = CK.threads(self.tile)
        unit_args = (ent, n_ent, pairs, n_pairs, post, norms, cache, bounds, maxima, tile_maxima, scores,
                     self.num_docs, self.n_groups, self.n_tiles, self.tf_bits, self.block_size, k)
        step = sample_step(n_units, rows, k, s)
        if not step:
            kn.scorer(n_units, threads, *unit_args, no_theta, running, 1, 0, stream=self.stream)
            return
        # A sample of the units first: the k-th largest of each row's tile maxima is reached by k docs. Few tiles
        # reach it (k / m of them, m sampled a row): a pass bounding every unit's maximum lists those whose tile
        # may, and only they are scored. Many: every other unit is scored, and those below it skip their read-out.
        filtered = filters(n_units, rows, k, step, s)
        listed = self.listed_room(n_units).data_ptr() if filtered else 0  # kth clears its count
        kn.scorer(-(-n_units // step), threads, *unit_args, no_theta, running, step, 0, stream=self.stream)
        kn.kth(rows, CK.KTH_THREADS, tile_maxima, self.n_tiles, k, theta, listed, stream=self.stream)
        if not filtered:
            kn.scorer(n_units, threads, *unit_args, theta, running, 1, step, stream=self.stream)
            return
        kn.filter(n_units // CK.filter_span(self.tpb), threads, ent, n_ent, pairs, n_pairs, post, norms, cache, bounds,
                  self.num_docs, self.tf_bits, self.block_size, theta, listed, stream=self.stream)
        kn.listed(kn.listed_grid, threads, *unit_args, theta, running, listed, stream=self.stream)


def _ranges(starts: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Concatenation of ``arange(starts[i], starts[i] + lens[i])`` over i."""
    total = int(lens.sum())
    idx = torch.arange(total, dtype=torch.int64, device=starts.device)
    return idx + torch.repeat_interleave(starts - (torch.cumsum(lens, 0) - lens), lens, output_size=total)


def score_torch(a, n, e0, ne, pbase, rowoff, w, post, bid, bst, norms, cache, acc_flat, tf_bits: int,
                block_shift: int) -> None:
    """The dense reference path in torch ops (any device), over a launch's work items (``planning.Items``) placed in
    the device arena: ``a`` first posting (shard-local), ``n`` postings, ``e0`` first entry (arena index), ``ne``
    entries, ``pbase`` arena offset of the shard's posting 0, ``rowoff`` = row * num_docs, ``w`` the term weight. Each
    posting adds ``f64(s)`` with ``s = w - w / (1 + tf * cache[norm])`` (every op in f32, as ``FORMAT.md`` defines it)
    into ``acc_flat[rowoff + doc]``. Items' entries cover exactly their postings."""
    n_items = a.numel()
    if n_items == 0:
        return
    ent = _ranges(e0, ne)
    ent_item = torch.repeat_interleave(torch.arange(n_items, device=a.device), ne, output_size=ent.numel())
    start = bst[ent].long() & M32
    cnt = (bst[ent + 1].long() & M32) - start
    total = int(n.sum())
    post_ent = torch.repeat_interleave(ent, cnt, output_size=total)
    post_item = torch.repeat_interleave(ent_item, cnt, output_size=total)
    p = post[_ranges(start + pbase[ent_item], cnt)].long() & M32
    doc = (bid[post_ent].long() << block_shift) + (p >> tf_bits)
    tf = p & ((1 << tf_bits) - 1)
    q = tf.to(torch.float32) * cache[norms[doc].long()]
    wi = w[post_item]
    s = wi - wi / (1 + q)
    acc_flat.index_add_(0, rowoff[post_item] + doc, s.to(torch.float64))


def inner_product(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``scores[i, j] = queries[i] . keys[j]``, shape [m, n], accumulated in f32 whatever the inputs' dtype."""
    q = queries if queries.dim() == 2 else queries[None]
    return torch.matmul(q.float(), keys.float().transpose(0, 1))


def batched_inner_product(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``inner_product`` over leading batch dimensions: queries [..., m, D], keys [..., n, D] -> [..., m, n] f32."""
    return torch.matmul(queries.float(), keys.float().transpose(-1, -2))


def bound_inner_product(queries: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Quest's bound ``sum_d max(q_d * lo_d, q_d * hi_d)``: queries [..., m, D], lo/hi [..., n, D] -> [..., m, n].

    As ``max(q*lo, q*hi) = q*hi`` where q >= 0 and ``q*lo`` elsewhere, the bound is two inner products,
    ``q+ . hi + q- . lo``, so it runs on the matrix units instead of materialising [m, n, D] products.
    """
    q = queries.float()
    return (torch.matmul(q.clamp(min=0), hi.float().transpose(-1, -2))
            + torch.matmul(q.clamp(max=0), lo.float().transpose(-1, -2)))
