"""``none``: chain-of-thought generation without retrieval (the wo-RAG baseline)."""
from __future__ import annotations

from ragserve.rag.base import RagMethod
from ragserve.rag.trace import Trace
from ragserve.retrieval.contract import Hit


class NoRetrieval(RagMethod):
    name = "none"
    uses_retrieval = False

    def _run(self, question: str, trace: Trace) -> tuple[str, list[Hit]]:
        _, gen = self.generate(trace, question, "", [], self.max_new_tokens, "line")
        return gen.text.strip(), []
