"""Export the C-simulation testbench's inputs from an index: pre-analysed queries and the CPU backend's results.

    python hls_bm25/tb_export.py --index DIR --queries FILE --k 1 10 100 1000 --out DIR

FILE is any query file ``ragserve search --queries`` reads, or the HotpotQA IRCoT JSONL (``question_text``).
Writes ``queries.txt`` (the norm cache and each query's term ids and weights, f32 as hex bits) and
``expected.txt`` (for each k, each query's top-k docids and f32 score bits), the formats
``tb_bm25_topk.cpp`` reads.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from indexer import bm25
from indexer.bm25 import QueryTerms
from ragserve.kernels.contract import TopK
from ragserve.retrieval.searcher import Searcher


def read_query_texts(path: str | Path) -> list[str]:
    path = Path(path)
    with open(path, "rb") as f:
        first = f.readline()
    if first.lstrip().startswith(b"{") and "question_text" in json.loads(first):
        with open(path, encoding="utf-8") as f:
            return [json.loads(line)["question_text"] for line in f if line.strip()]
    from ragserve.topics import read_queries
    return [q.text for q in read_queries(path)]


def _hex(values: np.ndarray) -> str:
    return " ".join(f"{v:08x}" for v in np.asarray(values, dtype=np.float32).view(np.uint32).tolist())


def write_queries(path: Path, cache: np.ndarray, queries: list[QueryTerms]) -> None:
    with open(path, "w") as f:
        f.write("cache " + _hex(cache) + "\n")
        f.write(f"nq {len(queries)}\n")
        for q in queries:
            w = np.asarray(q.weights, dtype=np.float32).view(np.uint32).tolist()
            f.write(" ".join([str(len(q))] + [f"{t} {x:08x}" for t, x in zip(q.term_ids.tolist(), w)]) + "\n")


def write_expected(f, k: int, results: list[TopK]) -> None:
    f.write(f"k {k}\n")
    for r in results:
        bits = np.asarray(r.scores, dtype=np.float32).view(np.uint32).tolist()
        f.write(" ".join([str(len(bits))] + [f"{d} {s:08x}" for d, s in zip(r.docids.tolist(), bits)]) + "\n")


def export(index: str | Path, query_file: str | Path, ks: list[int], out: str | Path) -> int:
    """Write both testbench files; returns the number of queries."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    searcher = Searcher(index, backend="cpu")
    ix = searcher.index
    queries = [searcher.analyze(t) for t in read_query_texts(query_file)]
    write_queries(out / "queries.txt", bm25.norm_cache(ix.k1, ix.b, ix.avgdl), queries)
    with open(out / "expected.txt", "w") as f:
        for k in ks:
            write_expected(f, k, searcher.backend.search_terms(queries, k, ix.k1, ix.b))
    searcher.close()
    return len(queries)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--k", type=int, nargs="+", default=[10])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if any(not 1 <= k <= 1024 for k in args.k):
        ap.error("each k must be between 1 and 1024 (the kernel's limit)")
    n = export(args.index, args.queries, args.k, args.out)
    print(f"exported {n} queries, k = {' '.join(map(str, args.k))} -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
