#!/usr/bin/env python
"""ragserve-cpu vs Lucene (pyserini 1.6.0, k1=0.9 b=0.4, default English analyzer) on one BEIR collection.

Both engines index the same corpus and answer the same queries in this one run. Prints the fraction of queries
whose top-10 equals Lucene's (as sets, and in order modulo exact-score ties), the largest relative score
difference, nDCG@10 and R@100 of both, and where they differ, index-level diagnostics and examples.

    .venv/bin/python scripts/parity_lucene.py --beir ../shared/data/beir-arguana
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.peers import lucene, parity  # noqa: E402
from ragserve.topics import read_qrels, read_queries  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--beir", type=Path, required=True, help="BEIR folder (corpus, queries, qrels/test.tsv)")
    ap.add_argument("--keep-query", action="store_true", help="do not drop each query's own document")
    ap.add_argument("--examples", type=int, default=5, help="mismatching queries to print")
    ap.add_argument("--workdir", type=Path, help="keep both indexes here (default: a temp dir)")
    args = ap.parse_args(argv)

    folder = args.beir
    corpus = next((folder / n for n in ("corpus.jsonl.gz", "corpus.jsonl") if (folder / n).exists()), None)
    qfile = next((folder / n for n in ("queries.jsonl.gz", "queries.jsonl") if (folder / n).exists()), None)
    if corpus is None or qfile is None or not (folder / "qrels" / "test.tsv").exists():
        sys.exit(f"{folder}: expected corpus.jsonl[.gz], queries.jsonl[.gz] and qrels/test.tsv")
    qrels = read_qrels(folder / "qrels" / "test.tsv")
    queries = [q for q in read_queries(qfile) if q.id in qrels]

    t0 = time.perf_counter()
    lucene.start_jvm()
    rep = parity.run_parity(corpus, queries, qrels, remove_query=not args.keep_query, workdir=args.workdir)
    print(f"{folder.name}: {rep.queries} queries, {time.perf_counter() - t0:.1f} s in all")
    print(f"top-{rep.top_k} equal to Lucene's: as sets {rep.set_equal:.2%}, in order modulo exact ties "
          f"{rep.order_equal:.2%}, identical (ids, f32 scores, tie order) {rep.identical:.2%}")
    print(f"max relative score difference (common docs in the top 100): {rep.max_rel_score_diff:.3g}")
    for engine in ("lucene", "ragserve"):
        e = rep.effectiveness[engine]
        own = rep.effectiveness_engine_order[engine]
        print(f"{engine:9s} nDCG@10 {e['ndcg_cut_10']:.4f} (trec_eval order; {own:.4f} in the engine's own tie order)"
              f"  R@100 {e['recall_100']:.4f}")
    delta = rep.effectiveness["ragserve"]["ndcg_cut_10"] - rep.effectiveness["lucene"]["ndcg_cut_10"]
    print(f"nDCG@10 difference ragserve - Lucene: {delta:+.4f}")

    d = rep.index_diff
    if d is not None:
        print("collection statistics  Lucene:", d.lucene_stats)
        print("                      ragserve:", d.ragserve_stats)
        more = "+" if len(d.norm_mismatches) >= 20 else ""
        print(f"documents whose length norm differs: {len(d.norm_mismatches)}{more} {d.norm_mismatches[:5]}")
        print(f"terms only in Lucene: {d.only_lucene[:10]}")
        print(f"terms only in ragserve: {d.only_ragserve[:10]}")
        print(f"terms whose df differs: {d.df_mismatches[:10]}")
    for m in rep.mismatches[:args.examples]:
        print(f"query {m.qid}:")
        for rank, (l, r) in enumerate(zip(m.lucene, m.ragserve), 1):
            flag = "" if l[0] == r[0] else "  <-"
            print(f"  {rank:2d}  lucene {l[0]:>24s} {l[1]:.7g}   ragserve {r[0]:>24s} {r[1]:.7g}{flag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
