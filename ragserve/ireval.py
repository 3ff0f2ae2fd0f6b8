"""Retrieval effectiveness measures with trec_eval's definitions (as ``trec_eval -c`` computes them).

trec_eval semantics kept here, since published BM25 numbers (Anserini, pyserini) come from it:
- a run is re-sorted by score descending, ties broken by document id in *descending* string order
  (trec_eval ignores the rank column);
- a document is relevant when its grade is >= 1; nDCG's gain is the grade itself, discount log2(rank + 1),
  and the ideal ranking is built from the qrels' grades;
- every query in the qrels is averaged (``-c``): a query without run entries, or without any relevant
  document, scores 0; run queries absent from the qrels are ignored.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

Run = Mapping[str, Sequence[tuple[str, float]]]
Qrels = Mapping[str, Mapping[str, int]]

DEFAULT_METRICS = ("ndcg_cut_10", "recall_100", "recip_rank_10")
RELEVANCE_LEVEL = 1  # trec_eval's default -l

_METRIC_RE = re.compile(r"^(ndcg_cut|recall|recip_rank|P)(?:[_.](\d+))?$")
_NEEDS_CUTOFF = ("ndcg_cut", "recall", "P")


class EvalError(ValueError):
    """An unknown metric name or unusable input."""


def trec_order(hits: Iterable[tuple[str, float]]) -> list[tuple[str, float]]:
    """Hits in the order trec_eval ranks them: score descending, then docid descending."""
    by_docid = sorted(hits, key=lambda h: h[0], reverse=True)
    return sorted(by_docid, key=lambda h: h[1], reverse=True)  # stable: ties keep the docid order


def ndcg(grades: Sequence[int], judged: Mapping[str, int], k: int) -> float:
    """nDCG@k of a ranked list of grades (-1 for unjudged) against the query's judgments."""
    dcg = sum(g / math.log2(i + 2) for i, g in enumerate(grades[:k]) if g > 0)
    ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall(grades: Sequence[int], judged: Mapping[str, int], k: int) -> float:
    num_rel = sum(1 for g in judged.values() if g >= RELEVANCE_LEVEL)
    if num_rel == 0:
        return 0.0
    return sum(1 for g in grades[:k] if g >= RELEVANCE_LEVEL) / num_rel


def recip_rank(grades: Sequence[int], k: int | None) -> float:
    for i, g in enumerate(grades if k is None else grades[:k]):
        if g >= RELEVANCE_LEVEL:
            return 1.0 / (i + 1)
    return 0.0


def precision(grades: Sequence[int], k: int) -> float:
    # trec_eval's P_k divides by k even when fewer than k documents were retrieved.
    return sum(1 for g in grades[:k] if g >= RELEVANCE_LEVEL) / k


def metric_function(name: str) -> Callable[[Sequence[int], Mapping[str, int]], float]:
    """The per-query function for a metric name such as ``ndcg_cut_10`` (or trec_eval's ``ndcg_cut.10``)."""
    m = _METRIC_RE.match(name)
    if not m:
        raise EvalError(f"unknown metric {name!r}: use ndcg_cut_K, recall_K, recip_rank[_K] or P_K")
    kind, cut = m.group(1), m.group(2)
    k = int(cut) if cut else None
    if k is not None and k < 1:
        raise EvalError(f"metric {name!r}: the cutoff must be >= 1")
    if k is None and kind in _NEEDS_CUTOFF:
        raise EvalError(f"metric {name!r} needs a cutoff, e.g. {kind}_10")
    if kind == "ndcg_cut":
        return lambda grades, judged: ndcg(grades, judged, k)
    if kind == "recall":
        return lambda grades, judged: recall(grades, judged, k)
    if kind == "P":
        return lambda grades, judged: precision(grades, k)
    return lambda grades, judged: recip_rank(grades, k)


def canonical_name(name: str) -> str:
    return name.replace(".", "_")


@dataclass
class EvalResult:
    metrics: tuple[str, ...]
    per_query: dict[str, dict[str, float]]  # every qrels query, in qrels order
    mean: dict[str, float]
    missing: list[str] = field(default_factory=list)  # qrels queries with no run entries (scored 0)
    ignored: list[str] = field(default_factory=list)  # run queries absent from the qrels

    def to_dict(self) -> dict:
        return {"metrics": list(self.metrics), "num_queries": len(self.per_query), "mean": self.mean,
                "missing": self.missing, "ignored": self.ignored, "per_query": self.per_query}


def evaluate(run: Run, qrels: Qrels, metrics: Sequence[str] = DEFAULT_METRICS, remove_query: bool = False) -> EvalResult:
    """Per-query and mean values over the qrels' queries. ``remove_query`` drops a hit whose docid equals the
    query id before ranking (Anserini's ``-removeQuery``, needed for ArguAna where queries are corpus docs)."""
    if not qrels:
        raise EvalError("the qrels hold no queries")
    if not metrics:
        raise EvalError("no metrics requested")
    names = tuple(canonical_name(m) for m in metrics)
    funcs = [metric_function(n) for n in names]
    per_query: dict[str, dict[str, float]] = {}
    missing = []
    for qid, judged in qrels.items():
        hits = run.get(qid)
        if not hits:
            missing.append(qid)
            hits = []
        if remove_query:
            hits = [h for h in hits if h[0] != qid]
        grades = [judged.get(docid, -1) for docid, _ in trec_order(hits)]
        per_query[qid] = {n: f(grades, judged) for n, f in zip(names, funcs)}
    mean = {n: math.fsum(v[n] for v in per_query.values()) / len(per_query) for n in names}
    ignored = [qid for qid in run if qid not in qrels]
    return EvalResult(names, per_query, mean, missing, ignored)
