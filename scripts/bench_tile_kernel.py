"""The CUDA tile scoring kernel alone, this checkout's against other versions' sources, side by side in one run.

    git show COMMIT:ragserve/kernels/gpu/cuda/relevancy.cu > /tmp/relevancy_COMMIT.cu
    python scripts/bench_tile_kernel.py --synth dpr21m 21000000 --workdir /tmp/synth --reference REF_IDX \
        --topics nq=NQ_TOPICS msmarco=MSMARCO_TOPICS --variant COMMIT=/tmp/relevancy_COMMIT.cu --json out.json

For each kernel version and query set (the first ``--batch`` mapped queries, as in ``bench_gpu.py``): registers
and resident blocks a multiprocessor, parity of the backend's top-k with the cpu backend's (k = 10 and 1000), and
the scoring stage of one batch timed by CUDA events (plan upload, bounds and scoring kernels; median of
``--reps``) at k = 10 (groups cut at the tile's k-th best), at k = 1000 (every matched group kept) and at k = 10
with every query sent term by term (``term_order="ascending"``). A variant file is another commit's scorer: its
``cuda/relevancy.cu``, or, before the kernels moved to ``.cu`` files, its ``tiles_cuda.py`` (whose ``SOURCE`` string
is the same part); it replaces this checkout's ``relevancy.cu`` in the program (the launch arguments must be the
same). ``--patches FILE [FILE ...]`` adds ablations of this checkout's scorer: each FILE maps a name to a list of
[old, new] text replacements of ``relevancy.cu`` (timing only: a patch that removes work changes the results, and the
mismatches say so), e.g.
``git show e48c55d:benchmarks/gpu_h200/kernel_ablations.json``. ``--sample-scales`` times each version at
several ``GpuSettings.sample_scale`` values (0: no sample of units, no threshold).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from indexer.reader import IndexReader  # noqa: E402
from tools.provenance import stamp  # noqa: E402
from ragserve.kernels.gpu.cuda import kernels as CK  # noqa: E402
from ragserve.kernels.contract import SearchError  # noqa: E402
from ragserve.kernels.gpu.backend import GpuBackend  # noqa: E402
from ragserve.kernels.gpu.relevancy import TileScorer  # noqa: E402
from ragserve.kernels.gpu.cuda.rtc import CudaModule  # noqa: E402
from ragserve.kernels.gpu.selection import TileSelector  # noqa: E402
from ragserve.kernels.gpu.settings import GpuSettings  # noqa: E402
from ragserve.retrieval.searcher import Searcher  # noqa: E402
from synth_layout import map_queries, write_layout  # noqa: E402

K1, B = 0.9, 0.4


def stage_ms(g: GpuBackend, chunk, cache: torch.Tensor, k: int, reps: int) -> float:
    """Median ms of begin + score of one planned batch (CUDA events)."""
    times = []
    for i in range(reps + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g._tiled.tiles.begin(chunk[0])
        g._tiled.tiles.score(chunk[1], g._arena.post, g._arena.norms, cache, k)
        b.record()
        torch.cuda.synchronize()
        if i >= 2:  # the first two warm up
            times.append(a.elapsed_time(b))
    return float(np.median(times))


def kernels_of(relevancy_source: str, g: GpuBackend) -> CK.TileKernels:
    """The program with ``relevancy_source`` for ``relevancy.cu``, compiled as the loader does."""
    tile, tpb = g._tiled.tiles.tile, g._tiled.tiles.tpb
    source = relevancy_source + CK.read_source("planning.cu") + CK.read_source("selection.cu")
    module = CudaModule(source, CK.options(tile, tpb, g.settings), g.device, "bm25_tiles")
    return CK.TileKernels(module, torch.cuda.get_device_properties(g.device).multi_processor_count
                          * CK.min_blocks(tile))


def use_kernels(g: GpuBackend, kernels: CK.TileKernels, sample_scale: float) -> None:
    """The backend's tiled path on ``kernels``, with that sample scale (a batch at a time: no single-query graphs)."""
    path, settings = g._tiled, replace(g.settings, sample_scale=sample_scale)
    tiles = path.tiles
    path.tiles = path.selector = path.graphs = None
    torch.cuda.empty_cache()
    path.tiles = TileScorer(g.num_docs, tiles.block_size, g.tf_bits, g.plan.rows, g.device, settings, kernels,
                            tiles.copies)
    path.selector = TileSelector(path.tiles, g.plan.rows, settings)
    path.tiles.sample(g._arena.post, 0, g._arena.stage_p)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--synth", nargs=2, metavar=("NAME", "DOCS"), required=True)
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--reference", type=Path, required=True)
    ap.add_argument("--topics", nargs="+", required=True, metavar="NAME=FILE")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FILE")
    ap.add_argument("--patches", type=Path, nargs="+", default=[],
                    help="JSON files: name -> [[old, new], ...] applied to this checkout's kernel")
    ap.add_argument("--sample-scales", type=float, nargs="+", default=[GpuSettings().sample_scale],
                    help="GpuSettings.sample_scale values to time each version at")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    idx = args.workdir / args.synth[0]
    if not (idx / "manifest.json").exists():
        write_layout(idx, int(args.synth[1]))
    reader = IndexReader(idx)
    cpu = Searcher(reader, backend="cpu")
    sets = {}
    for spec in args.topics:
        name, path = spec.split("=", 1)
        rows = map_queries(idx, args.reference, Path(path), 4 * args.batch)
        sets[name] = [q for q in (cpu.analyze(text) for _, text in rows) if len(q)][:args.batch]
    want = {(n, k): cpu.backend.search_terms(qs, k, K1, B) for n, qs in sets.items() for k in (10, 1000)}
    versions = {"this checkout": CK.read_source("relevancy.cu")}
    patches = {(f, name): pairs for f in args.patches for name, pairs in json.loads(f.read_text()).items()}
    for (f, name), pairs in patches.items():
        source = versions["this checkout"]
        for before, after in pairs:
            if before not in source:
                ap.error(f"{f}: patch {name!r}: {before[:60]!r} is not in this checkout's kernel")
            source = source.replace(before, after)
        versions[name] = source
    for spec in args.variant:
        name, path = spec.split("=", 1)
        if path.endswith(".py"):  # a tiles_cuda.py of before the move to .cu files
            mod_spec = importlib.util.spec_from_file_location(f"tiles_{name}", path)
            mod = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(mod)
            versions[name] = mod.SOURCE
        else:
            versions[name] = Path(path).read_text()
    try:
        g = GpuBackend(reader, scorer="cuda", max_batch=args.batch)
    except SearchError as e:  # NVRTC missing, say
        ap.error(str(e))
    _, cache, min_q = g._cache(K1, B)
    out = {"card": torch.cuda.get_device_name(0), "argv": sys.argv, "versions": {}}
    for name, source in versions.items():
        kernels = kernels_of(source, g)
        regs, blocks = kernels.scorer.occupancy(CK.threads(g._tiled.tiles.tile))
        res = {"registers": regs, "blocks_per_sm": blocks}
        for scale in args.sample_scales:
            use_kernels(g, kernels, scale)
            at = f" sample {scale:g}" if len(args.sample_scales) > 1 else ""
            for qn, qs in sets.items():
                for k in (10, 1000):
                    res[f"{qn} mismatches k={k}{at}"] = sum(not a.same_as(b) for a, b in
                                                            zip(g.search_terms(qs, k, K1, B), want[(qn, k)]))
                # min_q 0: nothing provably exact
                flat, loop = g._tiled.plan_chunk(qs, min_q), g._tiled.plan_chunk(qs, 0.0)
                res[f"{qn} ms k=10{at}"] = round(stage_ms(g, flat, cache, 10, args.reps), 3)
                res[f"{qn} ms k=1000{at}"] = round(stage_ms(g, flat, cache, 1000, args.reps), 3)
                res[f"{qn} ms k=10 term by term{at}"] = round(stage_ms(g, loop, cache, 10, args.reps), 3)
        out["versions"][name] = res
        print(name, json.dumps(res), flush=True)
    if args.json:
        args.json.write_text(json.dumps(stamp(out), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
