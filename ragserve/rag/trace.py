"""What one ``answer(question)`` call did, step by step, and where its time went.

Stages follow the memory pipeline: prepare (query formulation and analysis), relevancy (BM25 or
cross-encoder scoring), retrieval (top-k and fetching text), apply (prompt building, generation and the
trigger computations that read the model's output).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from ragserve.kernels.contract import StageTimes
from ragserve.retrieval.contract import Hit

STAGES = ("prepare", "relevancy", "retrieval", "apply")


@dataclass
class Step:
    kind: str  # generate | retrieve | answer | read (a long context read into memory)
    times: StageTimes = field(default_factory=StageTimes)
    text: str = ""  # generated text (generate / answer steps)
    tokens: int = 0  # tokens decoded in this step
    prompt_tokens: int = 0
    stop: str = ""
    query: str = ""  # retrieve steps
    hits: list[dict] = field(default_factory=list)  # [{"id", "title", "score"}]
    trigger: dict = field(default_factory=dict)  # the decision's inputs and outcome
    memory: dict = field(default_factory=dict)  # read steps: segments, tokens, evictions

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Add the wall time of the block to ``stage``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            setattr(self.times, stage, getattr(self.times, stage) + time.perf_counter() - t0)

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "times": self.times.to_dict()}
        if self.kind == "retrieve":
            d.update(query=self.query, hits=self.hits)
        elif self.kind == "read":
            d.update(memory=self.memory)
        else:
            d.update(text=self.text, tokens=self.tokens, prompt_tokens=self.prompt_tokens, stop=self.stop)
        if self.trigger:
            d["trigger"] = self.trigger
        return d


@dataclass
class Trace:
    question: str
    steps: list[Step] = field(default_factory=list)
    output: str = ""  # the full generated answer text
    answer: str = ""

    def add(self, kind: str) -> Step:
        step = Step(kind)
        self.steps.append(step)
        return step

    @staticmethod
    def hit_records(hits: list[Hit]) -> list[dict]:
        # an untitled passage (a StrategyQA fact, one sentence) is known by its text
        return [{"id": h.id, "title": h.title, "score": float(h.score), **({} if h.title else {"text": h.text})}
                for h in hits]

    @property
    def times(self) -> StageTimes:
        total = StageTimes()
        for s in self.steps:
            total.add(s.times)
        return total

    @property
    def retrievals(self) -> int:
        return sum(1 for s in self.steps if s.kind == "retrieve")

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.steps)

    def retrieved_titles(self) -> list[str]:
        return [h["title"] or h.get("text", "") for s in self.steps if s.kind == "retrieve" for h in s.hits]

    def to_dict(self) -> dict:
        return {"question": self.question, "answer": self.answer, "output": self.output,
                "retrievals": self.retrievals, "tokens": self.tokens, "times": self.times.to_dict(),
                "steps": [s.to_dict() for s in self.steps]}
