"""Fixed-interval retrieval: ``fixed-sentence`` (FS-RAG, retrieve before every sentence with the previous
sentence as the query) and ``fixed-length`` (FL-RAG, every n tokens with the previous n tokens)."""
from __future__ import annotations

from ragserve.rag.base import MethodError, RagMethod, finished
from ragserve.rag.text import join_text
from ragserve.rag.trace import Trace
from ragserve.retrieval.contract import Hit


class _FixedInterval(RagMethod):
    stop: str
    chunk: int

    def _run(self, question: str, trace: Trace) -> tuple[str, list[Hit]]:
        text, query, hits = "", question, []
        while (room := self.room(text)) > 0:
            hits = self.retrieve(trace, query, question)  # the first query is the question itself
            _, gen = self.generate(trace, question, text, hits, min(self.chunk, room), self.stop)
            if not gen.text.strip():
                break
            text = join_text(text, gen.text)
            query = gen.text
            if finished(gen, gen.text):
                break
        return text, hits


class FixedSentence(_FixedInterval):
    name = "fixed-sentence"
    options = ("sentence_max_tokens",)
    stop = "sentence"

    def __init__(self, *args, sentence_max_tokens: int = 64, **kw) -> None:
        super().__init__(*args, **kw)
        if sentence_max_tokens < 1:
            raise MethodError("sentence_max_tokens must be >= 1")
        self.chunk = sentence_max_tokens  # a run-on "sentence" is cut here


class FixedLength(_FixedInterval):
    name = "fixed-length"
    options = ("interval",)
    stop = "line"

    def __init__(self, *args, interval: int = 32, **kw) -> None:
        super().__init__(*args, **kw)
        if interval < 1:
            raise MethodError("interval must be >= 1")
        self.chunk = interval  # DRAGIN's FL-RAG configs use 32 tokens
