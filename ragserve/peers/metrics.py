"""Effectiveness and agreement measures for comparing ranked lists of two engines.

nDCG@k and recall@k follow trec_eval (linear gain, log2(rank + 1) discount, averaged over the judged queries
of the run); ranked lists are taken in the order given (best first).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

Ranked = Sequence[tuple[str, float]]  # (docid, score), best first


def ndcg_at(ranked: Mapping[str, Ranked], qrels: Mapping[str, Mapping[str, int]], k: int = 10) -> float:
    total, n = 0.0, 0
    for qid, hits in ranked.items():
        judged = qrels.get(qid)
        if judged is None:
            continue
        dcg = sum(judged.get(d, 0) / math.log2(r + 2) for r, (d, _) in enumerate(hits[:k]))
        ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
        idcg = sum(g / math.log2(r + 2) for r, g in enumerate(ideal))
        total += dcg / idcg if idcg > 0 else 0.0
        n += 1
    return total / n if n else 0.0


def recall_at(ranked: Mapping[str, Ranked], qrels: Mapping[str, Mapping[str, int]], k: int = 100) -> float:
    total, n = 0.0, 0
    for qid, hits in ranked.items():
        judged = qrels.get(qid)
        if judged is None:
            continue
        rel = {d for d, g in judged.items() if g > 0}
        if rel:
            total += len(rel & {d for d, _ in hits[:k]}) / len(rel)
        n += 1
    return total / n if n else 0.0


def tie_groups(hits: Ranked) -> list[frozenset[str]]:
    """Consecutive hits with exactly equal scores, as sets (their order is an engine's tie-break)."""
    groups: list[set[str]] = []
    last = None
    for d, s in hits:
        if groups and s == last:
            groups[-1].add(d)
        else:
            groups.append({d})
        last = s
    return [frozenset(g) for g in groups]


def same_order_modulo_ties(a: Ranked, b: Ranked, k: int) -> bool:
    """Top-k equal position by position, where hits whose scores tie exactly may come in any order.

    The k-th place may cut through a tie group, so the last group of each list only has to be a subset of the
    other engine's tie group at the same place.
    """
    ga, gb = tie_groups(list(a[:k])), tie_groups(list(b[:k]))
    if len(ga) != len(gb) or not ga:
        return not ga and not gb
    if ga[:-1] != gb[:-1]:
        return False
    return len(ga[-1]) == len(gb[-1])


def same_set(a: Ranked, b: Ranked, k: int) -> bool:
    return {d for d, _ in a[:k]} == {d for d, _ in b[:k]}


def max_rel_score_diff(a: Ranked, b: Ranked) -> float:
    """Largest |sa - sb| / |sb| over documents in both lists."""
    sb = dict(b)
    worst = 0.0
    for d, s in a:
        if d in sb and sb[d] != 0:
            worst = max(worst, abs(s - sb[d]) / abs(sb[d]))
    return worst
