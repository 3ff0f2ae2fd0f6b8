"""``bridge``: single retrieval that follows the top passage's links, for multi-hop (bridge) questions.

A bridge question names one entity and asks about another that only the first one's passage names ("the band
that recorded Abbey Road was formed in which city?": the album's passage names the Beatles, whose passage holds
the city). BM25 or a reranker ranks the second passage low, for the question does not name it. So: retrieve
``depth`` passages with the question once, keep the top one, then put first the candidates whose title the top
passage or the question names (a comparison question names both of its entities), then the rest in the
retriever's order; the first ``k`` go to the generator. One retrieval, no extra model call: the hop is a title
match over passages already retrieved.
"""
from __future__ import annotations

import re

from ragserve.rag.base import MethodError, RagMethod
from ragserve.rag.trace import Trace
from ragserve.retrieval.contract import Hit

_QUALIFIER = re.compile(r"\s*\([^()]*\)\s*$")  # "Titanic (1997 film)" is named as "Titanic"


def _name(title: str) -> str:
    return " ".join(_QUALIFIER.sub("", title).casefold().split())


def _names(text: str, name: str) -> bool:
    """``text`` (casefolded, spaces collapsed) names ``name`` as whole words."""
    return bool(name) and re.search(r"(?<!\w)" + re.escape(name) + r"(?!\w)", text) is not None


def bridge_passages(question: str, hits: list[Hit], k: int) -> list[Hit]:
    """The top hit, then the hits whose title (less a trailing parenthesised qualifier) the top hit's text or
    the question names, then the others, each group in the retriever's order, distinct titles, ``k`` at most."""
    if not hits:
        return []
    top = hits[0]
    where = (" ".join(top.text.casefold().split()), " ".join(question.casefold().split()))
    linked = [h for h in hits[1:] if any(_names(w, _name(h.title)) for w in where)]
    out, seen = [], set()
    for h in [top, *linked, *hits[1:]]:
        key = h.title or h.id  # an untitled passage stands for itself
        if key not in seen:
            seen.add(key)
            out.append(h)
        if len(out) == k:
            break
    return out


class BridgeRetrieval(RagMethod):
    name = "bridge"

    def __init__(self, *args, k: int = 2, depth: int = 100, **kw) -> None:
        # two passages, as many as a bridge question's gold ones: a third is most often a distractor, which a
        # small reader follows (hotpotqa-train100, gemma-3-270m over BM25: F1 39.0 at k = 2, 23.4 at k = 3)
        super().__init__(*args, k=k, **kw)
        if not isinstance(depth, int) or depth < self.k:
            raise MethodError(f"bridge depth must be an integer >= k ({self.k}), got {depth!r}")
        self.depth = depth

    def _run(self, question: str, trace: Trace) -> tuple[str, list[Hit]]:
        hits = self.retrieve(trace, question, question, k=min(self.depth, self.retriever.max_k),
                             pick=lambda hs: bridge_passages(question, hs, self.k))
        _, gen = self.generate(trace, question, "", hits, self.max_new_tokens, "line")
        return gen.text.strip(), hits

