"""``two-stage`` retrieval: a first stage's top-N (BM25, dense or hybrid), then a real model rescores the
(query, passage) pairs and keeps the top k: a cross-encoder (``AutoModelForSequenceClassification``) or a
bi-encoder (a sentence encoder, ``ragserve.retrieval.rerank``); ``load_reranker`` tells them apart.

``RerankingSearcher`` has the ``Searcher`` interface, so any RAG loop or the CLI can use it as its retriever.
Model scoring is counted as relevancy time, the final sort as retrieval time.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from indexer.reader import IndexReader
from ragserve.rag.generator import GeneratorError, resolve_device
from ragserve.kernels.contract import SearchError, StageTimes
from ragserve.rag.model_path import model_dir, model_path_problem
from ragserve.retrieval.searcher import Hit, Searcher


class CrossEncoder:
    kind = "cross-encoder"

    def __init__(self, model: str, device: str = "auto", batch_size: int = 32, max_length: int = 256) -> None:
        if problem := model_path_problem(model):
            raise GeneratorError(problem)
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if batch_size < 1 or max_length < 8:
            raise GeneratorError("batch_size must be >= 1 and max_length >= 8")
        self.device = resolve_device(device)
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir(model))
            self.model = AutoModelForSequenceClassification.from_pretrained(model_dir(model), dtype=dtype)
        except (OSError, ValueError) as e:
            raise GeneratorError(f"cannot load a cross-encoder from {model!r}: {e}") from e
        self.model.to(self.device).eval()
        limit = getattr(self.model.config, "max_position_embeddings", None)
        self.max_length = min(max_length, limit) if limit else max_length
        self.batch_size = batch_size
        self.name = model

    @torch.inference_mode()
    def score(self, query: str, passages: list[str]) -> np.ndarray:
        """Relevance of each passage to the query (the positive-class logit; the only logit of a 1-label model)."""
        out = []
        for i in range(0, len(passages), self.batch_size):
            chunk = passages[i:i + self.batch_size]
            enc = self.tokenizer([query] * len(chunk), chunk, padding=True, truncation="only_second",
                                 max_length=self.max_length, return_tensors="pt").to(self.device)
            logits = self.model(**enc).logits
            out.append(logits[:, -1].float().cpu())
        return torch.cat(out).numpy() if out else np.zeros(0, np.float32)

    def rescore_batch(self, queries: list[str], hits: list[list[Hit]]) -> list[np.ndarray]:
        return [self.score(q, [f"{h.title}: {h.text}" if h.title else h.text for h in hs])
                for q, hs in zip(queries, hits)]


def load_reranker(model: str, device: str = "auto", index: IndexReader | None = None):
    """A bi-encoder for a sentence-encoder directory (its stored embeddings in ``index``'s dense part reused when
    they are the same model's), else a cross-encoder."""
    from ragserve.retrieval.embedder import Embedder, EmbedderError, read_encoder_config

    try:
        read_encoder_config(model)
    except EmbedderError:
        return CrossEncoder(model, device=device)
    from ragserve.retrieval.rerank import BiEncoderReranker

    try:
        return BiEncoderReranker(Embedder(model, device=device), index)
    except EmbedderError as e:
        raise GeneratorError(str(e)) from None


class RerankingSearcher:
    def __init__(self, searcher: Searcher, reranker, depth: int = 100) -> None:
        if depth < 1:
            raise SearchError("rerank depth must be >= 1")
        self.searcher = searcher
        self.reranker = reranker
        self.depth = depth
        self.index = searcher.index
        self.backend_name = searcher.backend_name

    def search_batch(self, queries: list[str], k: int = 10, k1: float | None = None, b: float | None = None,
                     with_text: bool = True, times: StageTimes | None = None) -> list[list[Hit]]:
        """The first stage's top-``depth`` then the model's top ``k``; hit scores are the model's, ties kept in
        the first stage's order."""
        kw = {"k1": k1, "b": b} if k1 is not None or b is not None else {}
        first = self.searcher.search_batch(queries, k=max(self.depth, k), times=times, **kw)
        t0 = time.perf_counter()
        scores = self.reranker.rescore_batch(queries, first)
        t1 = time.perf_counter()
        out = []
        for hs, sc in zip(first, scores):
            order = sorted(range(len(hs)), key=lambda i: (-sc[i], i))[:k]
            out.append([Hit(docid=hs[i].docid, id=hs[i].id, score=float(sc[i]), title=hs[i].title if with_text else "",
                            text=hs[i].text if with_text else "") for i in order])
        if times is not None:
            times.relevancy += t1 - t0
            times.retrieval += time.perf_counter() - t1
        return out

    def search(self, query: str, k: int = 10, k1: float | None = None, b: float | None = None,
               with_text: bool = True, times: StageTimes | None = None) -> list[Hit]:
        return self.search_batch([query], k, k1, b, with_text, times)[0]

    def close(self) -> None:
        self.searcher.close()
