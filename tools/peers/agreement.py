"""Agreement between the ranked lists of two engines (effectiveness itself is ``ragserve.ireval``)."""
from __future__ import annotations

from typing import Sequence

Ranked = Sequence[tuple[str, float]]  # (docid, score), best first


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
