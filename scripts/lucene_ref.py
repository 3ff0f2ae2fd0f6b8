#!/usr/bin/env python
"""Lucene (pyserini 1.6.0) BM25 reference run on a BEIR collection, with full-precision scores.

Indexes ``corpus.jsonl[.gz]`` as Anserini's BEIR flat index (title and text in one field, default English
analyzer), searches every query with BM25 (k1, b), drops each query's own document (Anserini's ``-removeQuery``,
as ArguAna needs), writes a TREC run and prints nDCG@10 / R@100.

    .venv/bin/python scripts/lucene_ref.py --beir ../shared/data/beir-arguana --output /tmp/lucene.trec
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragserve.ireval import evaluate  # noqa: E402
from tools.peers import lucene  # noqa: E402
from tools.peers.parity import as_engine_order, lucene_run  # noqa: E402
from ragserve.topics import read_qrels, read_queries  # noqa: E402
from ragserve.trec import write_run  # noqa: E402


def beir_files(folder: Path) -> tuple[Path, Path, Path]:
    corpus = next((folder / n for n in ("corpus.jsonl.gz", "corpus.jsonl") if (folder / n).exists()), None)
    queries = next((folder / n for n in ("queries.jsonl.gz", "queries.jsonl") if (folder / n).exists()), None)
    qrels = folder / "qrels" / "test.tsv"
    if corpus is None or queries is None or not qrels.exists():
        sys.exit(f"{folder}: expected corpus.jsonl[.gz], queries.jsonl[.gz] and qrels/test.tsv")
    return corpus, queries, qrels


def pyserini_agreement(searcher: lucene.LuceneRef, queries) -> int:
    """Queries on which pyserini's LuceneSearcher returns the raw Lucene top-10. pyserini rounds scores to 4
    decimals (its own rounding rule) and orders ties by external id, so scores are compared to 1e-4 and ids as the
    set of hits scoring clearly above the 10th."""
    same = 0
    for q in queries:
        raw = searcher.search(q.text, 10)
        ps = [(h.docid, float(h.score)) for h in searcher.pyserini.search(q.text, 10)]
        if len(raw) != len(ps) or any(abs(h.score - s) > 1.01e-4 for h, (_, s) in zip(raw, ps)):
            continue
        cut = raw[-1].score + 2e-4 if raw else 0.0
        same += {h.id for h in raw if h.score > cut} == {d for d, s in ps if s > cut}
    return same


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--beir", type=Path, required=True, help="BEIR folder (corpus, queries, qrels/test.tsv)")
    ap.add_argument("--index", type=Path, help="Lucene index directory to reuse or create (default: a temp dir)")
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--k1", type=float, default=0.9)
    ap.add_argument("--b", type=float, default=0.4)
    ap.add_argument("--keep-query", action="store_true", help="do not drop each query's own document")
    ap.add_argument("--check", type=int, default=200, help="queries to cross-check against pyserini's LuceneSearcher")
    ap.add_argument("--output", type=Path, help="TREC run file to write (full-precision scores)")
    args = ap.parse_args(argv)

    corpus, qfile, qrels_file = beir_files(args.beir)
    t0 = time.perf_counter()
    lucene.start_jvm()
    print(f"JVM started in {time.perf_counter() - t0:.2f} s")
    with tempfile.TemporaryDirectory(prefix="lucene-ref-") as tmp:
        index = args.index or Path(tmp) / "index"
        if not index.exists():
            secs = lucene.index_beir(corpus, index, threads=1)
            print(f"indexed {corpus} in {secs:.2f} s -> {index}")
        t0 = time.perf_counter()
        searcher = lucene.LuceneRef(index, args.k1, args.b)
        print(f"searcher opened in {time.perf_counter() - t0:.2f} s ({searcher.num_docs} docs)")
        queries = read_queries(qfile)
        qrels = read_qrels(qrels_file)
        t0 = time.perf_counter()
        run = lucene_run(searcher, queries, args.k, not args.keep_query)
        secs = time.perf_counter() - t0
        print(f"searched {len(queries)} queries in {secs:.2f} s (k={args.k}, k1={args.k1}, b={args.b})")
        agree = pyserini_agreement(searcher, queries[:args.check])
        checked = min(args.check, len(queries))
        print(f"pyserini LuceneSearcher gives the same top-10 (scores to 4 decimals) on {agree}/{checked} queries")
        searcher.close()
    mean = evaluate(run, qrels, ("ndcg_cut_10", "recall_100", "recall_1000")).mean
    ranked = evaluate(as_engine_order(run), qrels, ("ndcg_cut_10",)).mean
    print(f"nDCG@10 {mean['ndcg_cut_10']:.4f} (trec_eval order)  {ranked['ndcg_cut_10']:.4f} (Lucene's order)"
          f"  R@100 {mean['recall_100']:.4f}  R@1000 {mean['recall_1000']:.4f}")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            n = write_run(f, run.items(), "lucene-bm25")
        print(f"wrote {n} lines to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
