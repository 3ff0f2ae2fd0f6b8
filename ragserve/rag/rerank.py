"""``two-stage`` retrieval: BM25 top-N from a ``Searcher``, then a cross-encoder
(``AutoModelForSequenceClassification``) rescores the (query, passage) pairs and keeps the top k.

``RerankingSearcher`` has the ``Searcher.search`` signature, so any RAG loop can use it as its retriever.
Cross-encoder scoring is counted as relevancy time, the final sort as retrieval time.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ragserve.rag.generator import GeneratorError, resolve_device
from ragserve.kernels.contract import SearchError, StageTimes
from ragserve.rag.model_path import model_path_problem
from ragserve.retrieval.searcher import Hit, Searcher


class CrossEncoder:
    def __init__(self, model: str, device: str = "auto", batch_size: int = 32, max_length: int = 256) -> None:
        if problem := model_path_problem(model):
            raise GeneratorError(problem)
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if batch_size < 1 or max_length < 8:
            raise GeneratorError("batch_size must be >= 1 and max_length >= 8")
        self.device = resolve_device(device)
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model)
            self.model = AutoModelForSequenceClassification.from_pretrained(model, dtype=dtype)
        except (OSError, ValueError) as e:
            raise GeneratorError(f"cannot load a cross-encoder from {model!r}: {e}") from e
        self.model.to(self.device).eval()
        limit = getattr(self.model.config, "max_position_embeddings", None)
        self.max_length = min(max_length, limit) if limit else max_length
        self.batch_size = batch_size

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


class RerankingSearcher:
    def __init__(self, searcher: Searcher, reranker: CrossEncoder, depth: int = 100) -> None:
        if depth < 1:
            raise SearchError("rerank depth must be >= 1")
        self.searcher = searcher
        self.reranker = reranker
        self.depth = depth

    def search(self, query: str, k: int = 10, *, times: StageTimes | None = None) -> list[Hit]:
        """BM25 top-``depth`` then the cross-encoder's top ``k``; hit scores are cross-encoder scores."""
        first = self.searcher.search(query, k=max(self.depth, k), times=times)
        t0 = time.perf_counter()
        scores = self.reranker.score(query, [f"{h.title}: {h.text}" if h.title else h.text for h in first])
        t1 = time.perf_counter()
        order = sorted(range(len(first)), key=lambda i: (-scores[i], i))[:k]
        hits = [Hit(docid=first[i].docid, id=first[i].id, score=float(scores[i]), title=first[i].title,
                    text=first[i].text) for i in order]
        if times is not None:
            times.relevancy += t1 - t0
            times.retrieval += time.perf_counter() - t1
        return hits
