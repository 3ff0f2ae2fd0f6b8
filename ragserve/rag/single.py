"""``single`` (SR-RAG): retrieve once with the question, then generate the whole answer. With the two-stage
reranker as its retriever this is the ``two-stage`` method."""
from __future__ import annotations

from ragserve.rag.base import RagMethod
from ragserve.rag.trace import Trace
from ragserve.retrieval.contract import Hit


class SingleRetrieval(RagMethod):
    name = "single"

    def _run(self, question: str, trace: Trace) -> tuple[str, list[Hit]]:
        hits = self.retrieve(trace, question, question)
        _, gen = self.generate(trace, question, "", hits, self.max_new_tokens, "line")
        return gen.text.strip(), hits
