"""ragserve-cpu against Lucene (pyserini) on one BEIR collection: same corpus, same queries, one process.

Both engines index the corpus (Lucene single-threaded, so its docids follow file order as ragserve's do), both
answer every query, and the report gives top-10 agreement, score differences, effectiveness of each, and
index-level diagnostics (collection statistics, per-document length norms, document frequencies) that locate
the cause of any disagreement in the analyzer, the document lengths or the idf.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indexer.reader import IndexReader
from ragserve.ireval import evaluate
from tools.peers import agreement, lucene
from ragserve.retrieval.searcher import Searcher
from ragserve.topics import Query

Run = dict[str, list[tuple[str, float]]]
METRICS = ("ndcg_cut_10", "recall_100")


@dataclass
class IndexDiff:
    """Index-level differences between the Lucene index and the ragserve index of the same corpus."""

    lucene_stats: dict
    ragserve_stats: dict
    norm_mismatches: list[tuple[str, int, int]]  # (doc id, Lucene norm byte, ragserve norm byte)
    only_lucene: list[tuple[str, int]]  # (term, df) in Lucene's vocabulary only
    only_ragserve: list[tuple[str, int]]
    df_mismatches: list[tuple[str, int, int]]  # (term, Lucene df, ragserve df)


@dataclass
class QueryDiff:
    qid: str
    lucene: list[tuple[str, float]]
    ragserve: list[tuple[str, float]]


@dataclass
class ParityReport:
    queries: int
    top_k: int
    set_equal: float  # fraction of queries whose top-k sets are equal
    order_equal: float  # fraction whose top-k order is equal modulo exact-score ties
    identical: float  # fraction whose top-k (ids, order, f32 scores) is identical, ties in the same order
    max_rel_score_diff: float  # over documents both engines return in the top 100
    effectiveness: dict[str, dict[str, float]]  # engine -> metric -> mean (trec_eval order)
    effectiveness_engine_order: dict[str, float]  # engine -> nDCG@10 keeping the engine's own tie order
    mismatches: list[QueryDiff] = field(default_factory=list)
    index_diff: IndexDiff | None = None


def lucene_index_view(index_dir: str | Path) -> dict:
    """Statistics, per-document norm bytes, ids and document frequencies of a Lucene index's ``contents``."""
    lucene.start_jvm()
    from jnius import autoclass

    reader = lucene.open_reader(index_dir)
    try:
        fld = "contents"
        n = reader.maxDoc()
        stored = reader.storedFields()
        ids = [stored.document(i).get("id") for i in range(n)]
        norms = np.zeros(n, dtype=np.int64)
        nv = autoclass("org.apache.lucene.index.MultiDocValues").getNormValues(reader, fld)
        no_more = autoclass("org.apache.lucene.search.DocIdSetIterator").NO_MORE_DOCS
        d = nv.nextDoc()
        while d != no_more:
            norms[d] = nv.longValue() & 0xFF  # the norm is a signed byte on the Java side
            d = nv.nextDoc()
        df: dict[str, int] = {}
        multi_terms = autoclass("org.apache.lucene.index.MultiTerms")
        te = multi_terms.getTerms(reader, fld).iterator()
        br = te.next()
        while br is not None:
            df[br.utf8ToString()] = int(te.docFreq())
            br = te.next()
        stats = {"num_docs": n, "doc_count": int(reader.getDocCount(fld)),
                 "sum_total_tf": int(reader.getSumTotalTermFreq(fld)), "vocab_size": len(df)}
        stats["avgdl"] = float(np.float32(stats["sum_total_tf"] / stats["doc_count"]))
        return {"stats": stats, "ids": ids, "norms": norms, "df": df}
    finally:
        reader.close()


def diff_indexes(lucene_dir: str | Path, index: IndexReader, limit: int = 20) -> IndexDiff:
    lv = lucene_index_view(lucene_dir)
    ours_ids = [index.external_id(i) for i in range(index.num_docs)]
    ours_norm = dict(zip(ours_ids, np.asarray(index.norms).tolist()))
    norm_mm = [(i, int(n), ours_norm.get(i, -1)) for i, n in zip(lv["ids"], lv["norms"].tolist())
               if ours_norm.get(i, -1) != n]
    ours_df = {t: int(index.df[i]) for t, i in index.term_ids.items()}
    only_l = sorted(((t, d) for t, d in lv["df"].items() if t not in ours_df), key=lambda x: -x[1])
    only_r = sorted(((t, d) for t, d in ours_df.items() if t not in lv["df"]), key=lambda x: -x[1])
    df_mm = sorted(((t, d, ours_df[t]) for t, d in lv["df"].items() if t in ours_df and ours_df[t] != d),
                   key=lambda x: -abs(x[1] - x[2]))
    st = index.manifest["stats"]
    ours_stats = {k: st[k] for k in ("num_docs", "doc_count", "sum_total_tf", "vocab_size", "avgdl")}
    return IndexDiff(lv["stats"], ours_stats, norm_mm[:limit], only_l[:limit], only_r[:limit], df_mm[:limit])


def lucene_run(searcher: lucene.LuceneRef, queries: list[Query], k: int, remove_query: bool) -> Run:
    """qid -> [(docid, score)] best first; with ``remove_query`` one extra hit is fetched and the query's own
    document dropped (Anserini's ``-removeQuery``)."""
    run = {}
    for q in queries:
        hits = searcher.search(q.text, k + 1 if remove_query else k)
        run[q.id] = [(h.id, h.score) for h in hits if not (remove_query and h.id == q.id)][:k]
    return run


def ragserve_run(searcher: Searcher, queries: list[Query], k: int, remove_query: bool) -> Run:
    results = searcher.search_batch([q.text for q in queries], k + 1 if remove_query else k, with_text=False)
    return {q.id: [(h.id, h.score) for h in hits if not (remove_query and h.id == q.id)][:k]
            for q, hits in zip(queries, results)}


def as_engine_order(run: Run) -> Run:
    """Scores replaced by -rank so trec_eval semantics keep the engine's own tie order.

    ArguAna holds exact duplicate passages whose scores tie exactly; trec_eval re-sorts ties by docid
    descending, Lucene and ragserve rank them by index order, which moves nDCG@10 in the third decimal.
    """
    return {q: [(d, -float(i)) for i, (d, _) in enumerate(hits)] for q, hits in run.items()}


def compare_runs(lrun: Run, rrun: Run, qrels: dict, k: int = 10, keep: int = 20) -> ParityReport:
    qids = list(lrun)
    set_eq = order_eq = same = 0
    worst = 0.0
    mismatches = []
    for qid in qids:
        a, b = rrun.get(qid, []), lrun[qid]
        s = agreement.same_set(a, b, k)
        o = agreement.same_order_modulo_ties(a, b, k)
        set_eq += s
        order_eq += o
        same += list(a[:k]) == list(b[:k])
        worst = max(worst, agreement.max_rel_score_diff(a, b))
        if not (s and o) and len(mismatches) < keep:
            mismatches.append(QueryDiff(qid, b[:k], a[:k]))
    eff = {name: evaluate(run, qrels, METRICS).mean for name, run in (("lucene", lrun), ("ragserve", rrun))}
    eff_order = {name: evaluate(as_engine_order(run), qrels, ("ndcg_cut_10",)).mean["ndcg_cut_10"]
                 for name, run in (("lucene", lrun), ("ragserve", rrun))}
    n = max(len(qids), 1)
    return ParityReport(len(qids), k, set_eq / n, order_eq / n, same / n, worst, eff, eff_order, mismatches)


def build_both(corpus: Path, workdir: Path) -> tuple[Path, Path, dict[str, float]]:
    """Index ``corpus`` with Lucene and ragserve under ``workdir``; returns both dirs and build seconds."""
    import time

    from indexer.options import BuildOptions
    from indexer.writer import build_index

    lucene_dir, ours_dir = workdir / "lucene", workdir / "ragserve"
    secs = {"lucene": lucene.index_beir(corpus, lucene_dir, threads=1)}
    t0 = time.perf_counter()
    # One process: the writer's worker pool forks, and forking a process that runs a JVM can deadlock the child.
    build_index([corpus], ours_dir, BuildOptions(progress=False, workers=1))
    secs["ragserve"] = time.perf_counter() - t0
    return lucene_dir, ours_dir, secs


def run_parity(corpus: Path, queries: list[Query], qrels: dict, k: int = 100, remove_query: bool = True,
               workdir: Path | None = None, diagnose: bool = True) -> ParityReport:
    """Index, search with both engines (top ``k``), compare the top-10s and evaluate both."""
    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        work = workdir or Path(tmp)
        lucene_dir, ours_dir, _ = build_both(corpus, work)
        lsearch = lucene.LuceneRef(lucene_dir)
        ours = Searcher(ours_dir, backend="cpu")
        try:
            lrun = lucene_run(lsearch, queries, k, remove_query)
            rrun = ragserve_run(ours, queries, k, remove_query)
            report = compare_runs(lrun, rrun, qrels)
            if diagnose:
                report.index_diff = diff_indexes(lucene_dir, ours.index)
        finally:
            lsearch.close()
            ours.close()
    return report
