"""Memory as context: a long input read segment by segment through a memory bank.

The input is cut into segments of ``segment_tokens`` encoder tokens (a segment never spans two documents).
Segments stream in order: each is embedded, its embedding queries the bank, which recalls the top-k *earlier*
segments into its context, and then it is stored (the oldest entry leaving once the bank is full). This is the
seeds' "memory resident on the device, segments streamed" setup of HMT / Titans, training-free: no memory
weights exist here, so a frozen sentence encoder makes the memory embeddings and the queries, and a generator
reads recalled segments as passages. After the read, ``search`` recalls segments for any query (a question), so
the memory is a retriever for the RAG loops.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable


from ragserve.kernels.contract import SearchError, StageTimes
from ragserve.memory.bank import MemoryBank, Recall
from ragserve.retrieval.contract import Hit, Retriever
from ragserve.retrieval.embedder import Embedder


@dataclass(frozen=True)
class MemoryOptions:
    segment_tokens: int = 128  # all-MiniLM-L6-v2 was trained on inputs of up to 128 word pieces
    capacity: int = 65536  # segments the bank holds before evicting the oldest
    k: int = 5  # earlier segments recalled into each segment's context
    backend: str = "cpu"
    device: str | None = None  # torch device of the gpu backend (default cuda)

    def check(self) -> None:
        if self.segment_tokens < 8 or self.capacity < 1 or self.k < 1:
            raise SearchError("memory needs segment_tokens >= 8, capacity >= 1 and k >= 1")


@dataclass
class Segment:
    index: int
    doc: int  # the input document it comes from
    title: str
    text: str
    tokens: int


@dataclass
class ReadResult:
    segments: list[Segment]
    recalls: list[Recall]  # per segment: the earlier segments recalled into its context
    evicted: int = 0
    times: StageTimes = field(default_factory=StageTimes)

    def summary(self) -> dict:
        return {"segments": len(self.segments), "tokens": sum(s.tokens for s in self.segments),
                "evicted": self.evicted, "times": self.times.to_dict()}


def segment_documents(docs: Iterable[tuple[str, str]], tokenizer, tokens: int) -> list[Segment]:
    """Cut each (title, text) into pieces of at most ``tokens`` tokenizer tokens, at word starts where one is
    in the second half of the piece (so words are rarely split)."""
    out: list[Segment] = []
    for d, (title, text) in enumerate(docs):
        if not text.strip():
            continue
        offs = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
        i = 0
        while i < len(offs):
            j = min(i + tokens, len(offs))
            if j < len(offs):
                cut = j
                while cut > i + tokens // 2 and offs[cut][0] == offs[cut - 1][1]:  # inside a word: step back
                    cut -= 1
                j = cut if cut > i + tokens // 2 else j
            out.append(Segment(len(out), d, title, text[offs[i][0]:offs[j - 1][1]], j - i))
            i = j
    return out


class MemoryContext(Retriever):
    """Reads a long input into a memory bank and recalls from it: a retriever over what it has read."""

    kind = "memory"

    def __init__(self, embedder: Embedder, options: MemoryOptions = MemoryOptions()) -> None:
        options.check()
        self.embedder = embedder
        self.options = options
        self.index = None
        self.backend_name = f"memory-{options.backend}"
        self.reset()

    def reset(self) -> None:
        """Forget everything read."""
        o = self.options
        self.bank = MemoryBank(self.embedder.dim, o.capacity, o.backend, o.device)
        self.segments: list[Segment] = []

    def read(self, docs: Iterable[tuple[str, str]] | str,
             store: Callable[[Segment], bool] | None = None) -> ReadResult:
        """Stream the input (a text, or (title, text) documents) through the memory, after what was read
        before: returns each new segment's recall of earlier segments. ``store(segment)`` False: the segment
        recalls but is not kept (a query in the stream, such as a question); default: every segment is kept."""
        t0 = time.perf_counter()
        docs = [("", docs)] if isinstance(docs, str) else list(docs)
        segs = segment_documents(docs, self.embedder.tokenizer, self.options.segment_tokens)
        base = len(self.segments)
        for s in segs:
            s.index += base
        self.segments.extend(segs)
        res = ReadResult(segs, [])
        res.times.prepare += time.perf_counter() - t0
        bs = self.embedder.batch_size
        for b0 in range(0, len(segs), bs):
            t1 = time.perf_counter()
            vecs = self.embedder.encode([s.text for s in segs[b0:b0 + bs]])
            res.times.prepare += time.perf_counter() - t1
            for j, v in enumerate(vecs):  # in order: a segment sees only those before it
                t2 = time.perf_counter()
                res.recalls.append(self.bank.recall(v, self.options.k)[0])
                t3 = time.perf_counter()
                if store is None or store(segs[b0 + j]):
                    res.evicted += len(self.bank.insert(v, [segs[b0 + j].index]))
                res.times.relevancy += t3 - t2
                res.times.prepare += time.perf_counter() - t3
        return res

    def context_of(self, result: ReadResult, i: int) -> list[Segment]:
        """Segment ``i`` of a read with the segments recalled into its context (best first) before it."""
        return [self.segments[int(j)] for j in result.recalls[i].ids] + [result.segments[i]]

    def _search_batch(self, queries: list[str], k: int, k1: float | None, b: float | None, with_text: bool,
                      times: StageTimes | None) -> list[list[Hit]]:
        t0 = time.perf_counter()
        qv = self.embedder.encode(queries)
        t1 = time.perf_counter()
        recalls = self.bank.recall(qv, k)
        t2 = time.perf_counter()
        out = [[Hit(docid=int(i), id=f"segment-{int(i)}", score=float(s), title=self.segments[int(i)].title,
                    text=self.segments[int(i)].text if with_text else "") for i, s in zip(r.ids, r.scores)]
               for r in recalls]
        if times is not None:
            times.add(StageTimes(prepare=t1 - t0, relevancy=t2 - t1, retrieval=time.perf_counter() - t2))
        return out

    def close(self) -> None:
        self.bank = None


__all__ = ["MemoryContext", "MemoryOptions", "ReadResult", "Segment", "segment_documents"]
