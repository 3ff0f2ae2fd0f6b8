"""The shared skeleton of every RAG method: timed retrieval and generation steps, the token budget, and
answer extraction (asking the model for the answer when its text lacks "the answer is")."""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Callable, ClassVar

from ragserve.rag.generator import Generation, Generator
from ragserve.rag.metrics import extract_answer, first_line_answer
from ragserve.rag.prompts import PromptBuilder
from ragserve.rag.text import has_answer, join_text
from ragserve.rag.trace import Step, Trace
from ragserve.retrieval.contract import Hit, Retriever


class MethodError(ValueError):
    """Bad method configuration."""


class RagMethod(ABC):
    name: ClassVar[str]
    uses_retrieval: ClassVar[bool] = True
    options: ClassVar[tuple[str, ...]] = ()  # method-specific keyword arguments

    def __init__(self, generator: Generator, prompts: PromptBuilder, retriever: Retriever | None = None, *,
                 k: int = 3, max_new_tokens: int = 100, query_max_tokens: int = 64,
                 answer_max_tokens: int = 24) -> None:
        if self.uses_retrieval and retriever is None:
            raise MethodError(f"method {self.name!r} needs a retriever (an index)")
        for label, v in (("k", k), ("max_new_tokens", max_new_tokens), ("query_max_tokens", query_max_tokens),
                         ("answer_max_tokens", answer_max_tokens)):
            if not isinstance(v, int) or v < 1:
                raise MethodError(f"{label} must be a positive integer, got {v!r}")
        self.generator = generator
        self.prompts = prompts
        self.retriever = retriever
        self.k = k
        self.max_new_tokens = max_new_tokens
        self.query_max_tokens = query_max_tokens
        self.answer_max_tokens = answer_max_tokens

    # -- the interface ----------------------------------------------------------------------
    def answer(self, question: str, context: list[tuple[str, str]] | None = None) -> tuple[str, Trace]:
        """Generate a chain-of-thought answer, retrieving as the method decides; returns the extracted
        answer and the trace of every step. ``context`` (title, text) documents, a long input, are first read
        into the retriever's memory (memory as context), which the method's retrievals then recall from. The
        generations run in one decode session (the caller's if it opened one), so each prompt is prefilled only
        past the prefix it shares with the previous one."""
        if not isinstance(question, str) or not question.strip():
            raise MethodError("question must be a non-empty string")
        trace = Trace(question)
        if context is not None:
            self.read_context(trace, context)
        session = getattr(self.generator, "session", None)  # a remote generator has none
        with session() if session is not None else contextlib.nullcontext():
            text, passages = self._run(question, trace)
            trace.output = text
            # a direct-answer prompt's prediction is its line; a chain of thought's follows "the answer is"
            answer = first_line_answer(text) if self.prompts.direct else extract_answer(text)
            if answer is None:
                answer = self._ask_answer(question, text, passages, trace)
        trace.answer = answer
        return answer, trace

    @abstractmethod
    def _run(self, question: str, trace: Trace) -> tuple[str, list[Hit]]:
        """The method's loop: the generated answer text and the passages last shown to the model."""

    # -- building blocks --------------------------------------------------------------------
    def read_context(self, trace: Trace, docs: list[tuple[str, str]]) -> None:
        """Memory as context: stream a long input segment by segment into a fresh memory (the retriever must be
        a ``ragserve.memory.reader.MemoryContext``)."""
        if not self.uses_retrieval or not hasattr(self.retriever, "read"):
            raise MethodError(f"method {self.name!r} cannot read a context: it needs a retrieving method with a "
                              "memory as its retriever")
        step = trace.add("read")
        self.retriever.reset()
        result = self.retriever.read(docs)
        step.times.add(result.times)
        step.memory = result.summary()

    def room(self, text: str) -> int:
        """Tokens left in the answer budget."""
        return self.max_new_tokens - self.generator.count_tokens(text)

    def retrieve(self, trace: Trace, query: str | Callable[[], str], fallback: str,
                 trigger: dict | None = None, k: int | None = None,
                 pick: Callable[[list[Hit]], list[Hit]] | None = None) -> list[Hit]:
        """One retrieval step: formulate the query (prepare), cut it to the token budget, search ``k`` passages
        (default ``self.k``); ``pick``, if given, chooses the passages kept from them (timed as retrieval)."""
        assert self.retriever is not None
        step = trace.add("retrieve")
        with step.timed("prepare"):
            q = query() if callable(query) else query
            q = self.generator.truncate(q, self.query_max_tokens).strip()
            if not any(c.isalnum() for c in q):
                q = self.generator.truncate(fallback, self.query_max_tokens).strip()
        step.query = q
        if trigger:
            step.trigger = trigger
        hits = self.retriever.search(q, k=k or self.k, times=step.times)
        if pick is not None:
            with step.timed("retrieval"):
                hits = pick(hits)
        step.hits = Trace.hit_records(hits)
        return hits

    def generate(self, trace: Trace, question: str, text: str, passages: list[Hit], max_new: int, stop: str,
                 kind: str = "generate") -> tuple[Step, Generation]:
        """One generation step (apply): build the prompt, decode."""
        step = trace.add(kind)
        with step.timed("apply"):
            prompt = self.prompts.build(question, text, passages)
            gen = self.generator.generate(prompt, max_new, stop)
        step.text, step.tokens, step.stop = gen.text, gen.tokens_generated, gen.stop
        step.prompt_tokens = gen.prompt_tokens
        return step, gen

    def _ask_answer(self, question: str, text: str, passages: list[Hit], trace: Trace) -> str:
        lead = "So the answer is"
        _, gen = self.generate(trace, question, join_text(text, lead), passages, self.answer_max_tokens, "line",
                               kind="answer")
        return extract_answer(lead + gen.text) or ""


def finished(gen: Generation, text: str) -> bool:
    """The model ended its answer: EOS, end of the answer line, a stop string, or the answer given."""
    return gen.stop in ("eos", "newline", "stop") or has_answer(text)
