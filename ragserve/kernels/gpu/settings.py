"""The GPU backend's tuning settings: one frozen object passed to ``GpuBackend(settings=...)`` and down to its stages.

Tests and benchmarks vary them with ``dataclasses.replace(GpuSettings(), ...)``; nothing reads a module global that a
caller may change. The figures in the comments are the measurements that chose each default (H200, 21M passages
unless said otherwise; ``benchmarks/RESULTS.md``).

What stays a module constant, in ``cuda/kernels.py`` and ``relevancy``, is the kernels' compile-time layout that host
buffers and launch grids share with them (threads a block, terms whose ranges sit in shared memory, the Query struct,
the running threshold's histogram, 32-doc groups): the CUDA sources' ``static_assert``s and the host's buffer sizes
depend on those together, so they are not knobs.
"""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class GpuSettings:
    # -- relevancy: the tile scorer -------------------------------------------------------------------------------
    tile_max: int = 2048  # docs a tile at most (a power of two): 16 KiB of f64 cells in shared memory or scratch
    # The CUDA scorer's sample: every S-th unit, S = sample_scale * sqrt(units a row / k); 0: none. 64 queries, with the
    # threshold skipping the read-out only: 1 and 2 alike at k = 10 (scoring -25% MS MARCO, -18% NQ); 2 also samples
    # k = 1000 there (-11%).
    sample_scale: float = 2.0
    min_sample_step: int = 4  # no sample when it would be more than a quarter of the units
    # Nor for fewer units than this, unless the filter runs: the sample alone costs about what it saves (the largest
    # queries, scripts/bench_gpu_single.py: one at a time at 21M, ~10,400 units, 1-3% faster without it; two, or one at
    # 100M, 3-18% with). With the filter, and a single query's launches in one graph, it pays there too: one run,
    # k = 10 5-6% faster with it, k = 1000 (no filter) 4% slower.
    sample_min_units: int = 16384
    # The 2-byte filter and a scoring of the units it lists, where at most 1 / filter_ratio of the units are expected
    # to reach the sample's threshold (64 queries, k = 10: scoring -15%, about 6% listed; where nearly all are, the
    # filter's pass is added work: k = 1000 +50%).
    filter_ratio: int = 4
    running_threshold: bool = True  # the CUDA scorer raises a row's threshold from its own tiles' maxima (run_scan)
    run_scan: int = 256  # compiled in: the running threshold's histogram is scanned every run_scan tiles a row
    unroll: int = 2  # compiled in: postings a thread has in flight on the flat path (two runs: 2 beat 4 by 3-10%)
    # -- selection ------------------------------------------------------------------------------------------------
    host_rank_max: int = 1 << 15  # candidates ranked on the host up to this; a device sort beyond (1 << 20: slower)
    peek: int = 4096  # candidates read back with their count in one transfer, at most; more take a second one
    peek_per_hit: int = 2  # and no more than this many per hit asked for (4,096 took 2.5 us a query)
    peek_min: int = 256
    min_capacity: int = 1 << 16  # candidates the collect kernel may append (grown and scored again when more reach it)
    candidates_per_hit: int = 4  # and at least this many per hit asked for
    # -- single queries -------------------------------------------------------------------------------------------
    max_graphs: int = 8  # single-query CUDA graphs kept (one for each k and BM25 parameters asked for lately)
    # -- the Triton kernels (where NVRTC is missing, and under Triton's interpreter in CI) ----------------------------
    chunk: int = 128  # postings a vector step: a term has ~0-1,000 postings in a tile, and idle lanes cost issue slots
    entry_block: int = 16  # terms whose tile ranges are read at once
    collect_sub: int = 64  # groups the collect kernel reads at once where some reach the threshold
    programs_per_sm: int = 16  # persistent scoring programs a multiprocessor
    num_warps: int = 4
    # -- host and memory ------------------------------------------------------------------------------------------
    bounce_elems: int = 16 << 20  # host->device uploads go through a pinned buffer of this many 4-byte words
    budget_fraction: float = 0.9  # of the free device memory, when no memory_bytes is given

    def __post_init__(self) -> None:
        if self.tile_max < 1 or self.tile_max & (self.tile_max - 1):
            raise ValueError(f"tile_max must be a power of two, got {self.tile_max}")
        if not 0.0 < self.budget_fraction <= 1.0:
            raise ValueError(f"budget_fraction must be in (0, 1], got {self.budget_fraction}")
        for f in fields(self):
            v = getattr(self, f.name)
            if type(v) in (int, float) and v < 0:
                raise ValueError(f"{f.name} must not be negative, got {v}")
        for name in ("run_scan", "unroll", "peek", "chunk", "entry_block", "collect_sub", "programs_per_sm",
                     "num_warps", "bounce_elems", "max_graphs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
