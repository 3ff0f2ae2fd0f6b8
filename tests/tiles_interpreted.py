"""Run by tests/test_gpu_tiles_interpreted.py in a fresh process with TRITON_INTERPRET=1 (Triton reads it when the
kernels are defined): the tiled gpu path's Triton kernels, interpreted on the CPU, against the cpu backend.

    TRITON_INTERPRET=1 python -m tests.tiles_interpreted HOTPOT_INDEX HOTPOT_JSONL ARGUANA_INDEX ARGUANA_QUERIES
"""
from __future__ import annotations

import json
import sys

from indexer.reader import IndexReader
from ragserve.kernels.gpu.backend import GpuBackend
from ragserve.kernels.gpu.settings import GpuSettings
from ragserve.retrieval.searcher import Searcher
from ragserve.topics import read_queries


def mismatches(gpu: GpuBackend, cpu, queries, k: int) -> int:
    got, want = gpu.search_terms(queries, k, 0.9, 0.4), cpu.search_terms(queries, k, 0.9, 0.4)
    assert sum(len(r.docids) for r in got) > 0
    return sum(not a.same_as(b) for a, b in zip(got, want))


def main(hotpot_index: str, hotpot_jsonl: str, arguana_index: str, arguana_queries: str) -> int:
    bad = {}
    reader = IndexReader(hotpot_index)
    s = Searcher(reader, backend="cpu", threads=1)
    with open(hotpot_jsonl) as f:
        qs = [s.analyze(json.loads(line)["question_text"]) for line in f][:6]
    g = GpuBackend(reader, device="cpu", scorer="triton", max_batch=2)  # three batches: the overlapped planning
    for k in (1, 1000):
        bad[f"hotpot k={k}"] = mismatches(g, s.backend, qs, k)
    budget = GpuBackend(reader, device="cpu", scorer="triton", max_batch=1).plan.total_bytes - 1
    streaming = GpuBackend(reader, device="cpu", scorer="triton", memory_bytes=budget, max_batch=2)
    assert streaming.describe()["streamed_shards"] >= 1
    bad["hotpot streamed k=10"] = mismatches(streaming, s.backend, qs, 10)
    # A second transfer, and a batch scored again (the first collect cleared the maxima) with more room.
    small = GpuBackend(reader, device="cpu", scorer="triton", max_batch=2,
                       settings=GpuSettings(peek=8, min_capacity=16, candidates_per_hit=0))
    launches = []
    launch = small._tiled.launch_chunk
    small._tiled.launch_chunk = lambda *a: (launches.append(1), launch(*a))
    bad["hotpot k=100, small capacity"] = mismatches(small, s.backend, qs, 100)
    bad["hotpot k=100, small capacity: no batch scored again"] = int(len(launches) <= 3)
    # The collect kernel leaves the maxima zero for the next batch.
    bad["maxima left nonzero"] = sum(int((b._tiled.tiles.maxima != 0).sum() + (b._tiled.tiles.tile_maxima != 0).sum())
                                     for b in (g, small))
    reader = IndexReader(arguana_index)
    s = Searcher(reader, backend="cpu", threads=1)
    # whole arguments, more terms than a tile holds (16), yet short enough for the interpreter (the first are 285)
    qs = [q for q in (s.analyze(q.text) for q in read_queries(arguana_queries)[:20]) if 16 < q.term_ids.size <= 40][:2]
    g = GpuBackend(reader, device="cpu", scorer="triton", max_batch=2)
    bad["arguana k=10"] = mismatches(g, s.backend, qs, 10)
    device_ranking = GpuBackend(reader, device="cpu", scorer="triton", max_batch=2,
                                settings=GpuSettings(host_rank_max=0))
    bad["arguana k=1000, device ranking"] = mismatches(device_ranking, s.backend, qs, 1000)
    print(json.dumps(bad))
    return 1 if any(bad.values()) else 0


if __name__ == "__main__":
    from tests.interpreter_compat import repair_scalar_index

    repair_scalar_index()
    raise SystemExit(main(*sys.argv[1:]))
