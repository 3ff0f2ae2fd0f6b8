"""The CUDA C kernels of ``*.cu``: their compile-time layout, the defines and options NVRTC compiles them with, and
their launch signatures.

``relevancy.cu`` (the tile scorer, the filter, the listed units' scorer), ``planning.cu`` (samples, tile ranges, a
single query's plan) and ``selection.cu`` (k-th largest tile maximum, collect, a single query's ranking) are compiled
as one program, in that order, at first use (``rtc``): one module load, and every kernel sees the same defines.

The constants below are that layout, shared by the kernels and the host's buffers and launch grids, and checked by the
sources' ``static_assert``s: they are not tuning knobs. The tuning that enters the kernels (``unroll``, ``run_scan``)
comes from ``GpuSettings``.
"""
from __future__ import annotations

from importlib import resources

import torch

from ragserve.kernels.gpu.cuda.rtc import CudaModule
from ragserve.kernels.gpu.settings import GpuSettings

SOURCES = ("relevancy.cu", "planning.cu", "selection.cu")  # one program, in this order
OPTIONS = ["--fmad=false"]  # every f32 operation rounded as written (indexer/FORMAT.md's arithmetic)
ARCH = "sm_90"  # the architecture CI compiles for (Hopper: the H200 the figures come from)

THREADS = 128  # threads per block: a tile's term has ~0-1,000 postings
MAX_TERMS = 64  # entries whose ranges sit in shared memory at once (the flat path's prefix sum: 2 per lane)
COLLECT_GROUPS = 1024  # groups a collect block reads (its tiles' maxima cleared with them: a multiple of TILE / 32)
BOUNDS_THREADS = 256
SAMPLE = 32  # tile_start's samples: the tile of every SAMPLE-th posting of the arena (a 128-byte line of postings)
KTH_THREADS = 1024
KTH_REG = 16  # tile maxima a kth_largest thread keeps in registers: all of a row up to 16,384 tiles (33M docs)
COLLECT_THREADS = 256
SORT_MAX = 2048  # candidates of a single query ranked on the device (16 KiB of keys in shared memory)
RANK_THREADS = 256
RANK_SPLIT = 32  # threads counting the keys below one key (a power of two, <= 32: lanes of one warp; H200,
# 1,050 keys: 2.3 us with 32, 2.6 with 16, 3.0 with 8)
RANK_BLOCKS = SORT_MAX * RANK_SPLIT // RANK_THREADS
QMAX = 128  # terms of a query planned on the device (``plan_single``); more: on the host
QUERY_WORDS = 2 + 2 * QMAX  # its Query struct, in 4-byte words
PLAN_TERMS = 32  # plan_single's grid covers queries of up to this many terms in one pass
# The scorer's running threshold (``run_scan``): a histogram of tile maxima, 16 bins a power of two from 2^-40 (the
# bins' edges 4.4% apart), scanned every ``run_scan`` tiles a row; a row's words: the bins, the tiles counted, the
# threshold and two spare (rows 16 bytes apart: the scan reads the bins 16 bytes at a time).
RUN_BINS, RUN_SHIFT, RUN_BASE = 1024, 19, (127 - 40) << 4
RUN_WORDS = RUN_BINS + 4

UNIT_SIGNATURE = ["ptr", "i64", "ptr", "i64", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "i64", "i64", "i64",
                  "i32", "i64", "i32", "ptr", "ptr"]
SIGNATURE = UNIT_SIGNATURE + ["i64", "i64"]  # bm25_tiles: and the unit and skip steps
LISTED_SIGNATURE = UNIT_SIGNATURE + ["ptr"]
FILTER_SIGNATURE = ["ptr", "i64", "ptr", "i64", "ptr", "ptr", "ptr", "ptr", "i64", "i32", "i64", "ptr", "ptr"]


def threads(tile: int) -> int:
    """Threads per block for ``tile``-doc tiles (a power of two >= 32)."""
    return min(THREADS, tile)


def min_blocks(tile: int) -> int:
    """Blocks that fit a multiprocessor's shared memory (~228 KiB on Hopper; the tile's f64 cells, ~2 KiB of other
    arrays and 1 KiB reserved each), as a register budget: more registers would leave fewer blocks resident."""
    return max(1, min(32, 2048 // threads(tile), (228 << 10) // (8 * tile + (3 << 10))))


def filter_span(tpb: int) -> int:
    """Tiles a ``bm25_filter`` block bounds at once (``tpb`` tiles a doc block)."""
    return 2 if tpb % 2 == 0 else 1


def filter_blocks(tile: int, tpb: int) -> int:
    """``min_blocks`` of the filter: 2 bytes a doc of its span."""
    return max(1, min(32, 2048 // threads(tile), (228 << 10) // (2 * filter_span(tpb) * tile + (3 << 10))))


def sample_bytes(tpb: int) -> int:
    """Bytes of a ``make_samples`` sample: a tile of a doc block (``tpb`` of them)."""
    return 1 if tpb <= 256 else 2


def defines(tile: int, tpb: int, settings: GpuSettings) -> dict[str, int]:
    """The sources' compile-time constants for ``tile``-doc tiles, ``tpb`` of them a doc block."""
    return {"TILE": tile, "TPB": tpb, "THREADS": threads(tile), "MAX_TERMS": MAX_TERMS, "UNROLL": settings.unroll,
            "MIN_BLOCKS": min_blocks(tile), "FILTER_BLOCKS": filter_blocks(tile, tpb),
            "FSPAN": filter_span(tpb), "COLLECT_GROUPS": COLLECT_GROUPS,
            "KTH_THREADS": KTH_THREADS, "KTH_REG": KTH_REG, "COLLECT_THREADS": COLLECT_THREADS,
            "SORT_MAX": SORT_MAX, "SAMPLE": SAMPLE, "SAMPLE_BYTES": sample_bytes(tpb), "RANK_THREADS": RANK_THREADS,
            "RANK_SPLIT": RANK_SPLIT, "QMAX": QMAX,
            "RUN_BINS": RUN_BINS, "RUN_SHIFT": RUN_SHIFT, "RUN_BASE": RUN_BASE, "RUN_SCAN": settings.run_scan,
            "RUN_WORDS": RUN_WORDS}


def options(tile: int, tpb: int, settings: GpuSettings) -> list[str]:
    """NVRTC's options for the program (the architecture apart): ``OPTIONS`` and the defines as ``-D``."""
    return OPTIONS + [f"-D{k}={v}" for k, v in defines(tile, tpb, settings).items()]


def read_source(name: str) -> str:
    """The text of ``cuda/<name>``, installed as package data."""
    return (resources.files("ragserve.kernels.gpu.cuda") / name).read_text(encoding="utf-8")


def source() -> str:
    """The one program NVRTC compiles: ``SOURCES`` end to end."""
    return "".join(read_source(name) for name in SOURCES)


class TileKernels:
    """The program's kernels for one tile size: ``scorer``, ``filter`` and ``listed`` (``relevancy.cu``; launch them
    with ``threads(tile)`` threads a block), ``samples``, ``bounds``, ``query_in`` and ``plan`` (``planning.cu``),
    ``kth``, ``collect`` and ``rank`` (``selection.cu``). ``module`` gives a kernel by name and signature (a
    ``CudaModule``); ``listed_grid`` is ``bm25_listed``'s grid, the blocks that are resident at once."""

    def __init__(self, module, listed_grid: int) -> None:
        self.scorer = module.kernel("bm25_tiles", SIGNATURE)
        self.filter = module.kernel("bm25_filter", FILTER_SIGNATURE)
        self.listed = module.kernel("bm25_listed", LISTED_SIGNATURE)
        self.listed_grid = listed_grid
        self.bounds = module.kernel("tile_bounds", ["ptr", "i64", "ptr", "ptr", "ptr", "i32"])
        self.samples = module.kernel("make_samples", ["ptr", "ptr", "i64", "i64", "i32"])
        self.kth = module.kernel("kth_largest", ["ptr", "i64", "i32", "ptr", "ptr"])
        self.collect = module.kernel("collect", ["ptr", "ptr", "ptr", "ptr", "i64", "i64", "i64", "ptr", "i64", "ptr"])
        self.rank = module.kernel("rank_candidates", ["ptr", "i64", "ptr", "i32", "i32"])
        self.query_in = module.kernel("query_in", ["ptr", "ptr"])
        self.plan = module.kernel("plan_single", ["ptr", "ptr", "i32", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "i64",
                                                  "i64", "ptr", "ptr", "i32"])

    @staticmethod
    def build(tile: int, tpb: int, device: torch.device, settings: GpuSettings) -> "TileKernels":
        """Compile the program for ``device`` (NVRTC) and load it; raises ``rtc.RtcError`` where it cannot."""
        module = CudaModule(source(), options(tile, tpb, settings), device, "bm25_tiles")
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return TileKernels(module, sms * min_blocks(tile))
