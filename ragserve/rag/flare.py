"""``flare``: FLARE's active retrieval (Jiang et al., 2023, "direct" variant).

Retrieve with the question, then repeatedly generate a look-ahead sentence. If any of its tokens has
probability below ``theta`` the sentence is not trusted: retrieve with the sentence as the query, its
low-confidence words (a token below ``beta``) masked out (after a direct-answer prompt, the question then the
masked tentative answer), and regenerate the sentence with the new passages. Otherwise accept it.
"""
from __future__ import annotations

import numpy as np

from ragserve.rag import text as T
from ragserve.rag.base import MethodError, RagMethod, finished
from ragserve.rag.trace import Trace
from ragserve.retrieval.contract import Hit


def flare_fires(probs: np.ndarray, theta: float) -> bool:
    """Retrieve when any token of the look-ahead sentence has probability below ``theta``."""
    return bool(np.size(probs)) and float(np.min(probs)) < theta


def masked_query(text: str, token_spans: list[tuple[int, int]], probs: np.ndarray, beta: float) -> str:
    """``text`` without the words that contain a token of probability below ``beta`` (a word fragment is of
    no use to BM25, so the whole word goes) and without punctuation."""
    low = [span for span, p in zip(token_spans, probs) if p < beta]
    kept = []
    for s, e in T.words(text):
        if not any(c.isalnum() for c in text[s:e]):
            continue
        if any(ts < e and te > s for ts, te in low):
            continue
        kept.append(text[s:e])
    return " ".join(kept)


class Flare(RagMethod):
    name = "flare"
    options = ("theta", "beta", "look_ahead")

    def __init__(self, *args, theta: float = 0.8, beta: float = 0.4, look_ahead: int = 64, **kw) -> None:
        super().__init__(*args, **kw)
        if not (0 <= beta <= 1 and 0 <= theta <= 1):
            raise MethodError("theta and beta are probabilities in [0, 1]")
        if look_ahead < 1:
            raise MethodError("look_ahead must be >= 1")
        self.theta, self.beta, self.look_ahead = theta, beta, look_ahead

    def query(self, question: str, look) -> str:
        """The masked look-ahead sentence; after a direct-answer prompt that "sentence" is the bare tentative
        answer, which says nothing of what was asked, so the question leads the query."""
        masked = masked_query(look.text, look.spans, look.probs, self.beta)
        return T.join_text(question, masked) if self.prompts.direct else masked

    def _run(self, question: str, trace: Trace) -> tuple[str, list[Hit]]:
        hits = self.retrieve(trace, question, question)  # FLARE starts from the input's own retrieval
        text = ""
        while (room := self.room(text)) > 0:
            step, gen = self.generate(trace, question, text, hits, min(self.look_ahead, room), "sentence")
            if not gen.text.strip():
                break
            with step.timed("apply"):
                probs = gen.probs
                fired = flare_fires(probs, self.theta)
            step.trigger = {"min_prob": float(probs.min()) if probs.size else None, "theta": self.theta,
                            "fired": fired}
            if fired:
                look = gen
                hits = self.retrieve(trace, lambda: self.query(question, look), question)
                _, gen = self.generate(trace, question, text, hits, min(self.look_ahead, room), "sentence")
                if not gen.text.strip():
                    break
            text = T.join_text(text, gen.text)
            if finished(gen, gen.text):
                break
        return text, hits
