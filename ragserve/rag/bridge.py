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

import itertools
import math
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
        # small reader follows (hotpotqa-train100, gemma-3-270m: F1 36.0 at k = 2, 31.4 at k = 3)
        super().__init__(*args, k=k, **kw)
        if not isinstance(depth, int) or depth < self.k:
            raise MethodError(f"bridge depth must be an integer >= k ({self.k}), got {depth!r}")
        self.depth = depth

    def _run(self, question: str, trace: Trace) -> tuple[str, list[Hit]]:
        hits = self.retrieve(trace, question, question, k=min(self.depth, self.retriever.max_k),
                             pick=lambda hs: bridge_passages(question, hs, self.k))
        _, gen = self.generate(trace, question, "", hits, self.max_new_tokens, "line")
        return gen.text.strip(), hits


class BridgeSelect(BridgeRetrieval):
    """``bridge-select``: the bridge passages (``k`` = 3), read in every pair, one generation each; the answer kept
    is the one whose first token the model gave the highest probability, its confidence in how the answer starts.
    A pair is as many passages as a bridge question's gold ones, and the best pair is not always the first two.
    Costs C(k, 2) generations (3 at k = 3), their prompts sharing the exemplars' prefix."""
    name = "bridge-select"

    def __init__(self, *args, k: int = 3, **kw) -> None:
        super().__init__(*args, k=k, **kw)
        if self.k < 2:
            raise MethodError(f"bridge-select reads pairs of passages: k must be >= 2, got {self.k}")

    def _run(self, question: str, trace: Trace) -> tuple[str, list[Hit]]:
        hits = self.retrieve(trace, question, question, k=min(self.depth, self.retriever.max_k),
                             pick=lambda hs: bridge_passages(question, hs, self.k))
        if len(hits) < 2:  # nothing to choose between
            _, gen = self.generate(trace, question, "", hits, self.max_new_tokens, "line")
            return gen.text.strip(), hits
        best = None
        for pair in itertools.combinations(range(len(hits)), 2):
            step, gen = self.generate(trace, question, "", [hits[i] for i in pair], self.max_new_tokens, "line")
            first = float(gen.logprobs[0]) if len(gen.logprobs) and gen.text.strip() else -math.inf
            step.trigger = {"passages": list(pair), "first_logprob": first}
            if best is None or first > best[0]:  # ties keep the earlier pair
                best = (first, gen.text.strip(), pair, step)
        best[3].trigger["kept"] = True
        return best[1], [hits[i] for i in best[2]]
