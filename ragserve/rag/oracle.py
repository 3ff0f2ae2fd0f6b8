"""``oracle``: the question's gold supporting paragraphs in the prompt, then the whole answer, with no
retrieval: the ceiling that perfect retrieval gives this generator and prompt (the evaluation's oracle row)."""
from __future__ import annotations

from ragserve.rag.base import MethodError, RagMethod
from ragserve.rag.trace import Trace
from ragserve.retrieval.contract import Hit


class Oracle(RagMethod):
    name = "oracle"
    uses_retrieval = False
    gold_context = True  # the evaluation passes each question's gold paragraphs as its context

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._gold: list[Hit] | None = None

    def read_context(self, trace: Trace, docs: list[tuple[str, str]]) -> None:
        """Take the question's gold (title, text) paragraphs; they are shown, not retrieved."""
        self._gold = [Hit(-1, f"gold{i}", 1.0, title, text) for i, (title, text) in enumerate(docs)]

    def _run(self, question: str, trace: Trace) -> tuple[str, list[Hit]]:
        gold, self._gold = self._gold, None
        if gold is None:
            raise MethodError("method 'oracle' needs the question's gold paragraphs as its context")
        _, gen = self.generate(trace, question, "", gold, self.max_new_tokens, "line")
        return gen.text.strip(), gold
