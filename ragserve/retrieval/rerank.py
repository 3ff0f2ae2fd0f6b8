"""Bi-encoder re-scoring of a first stage's hits: the inner product of the query's and each passage's embedding.

Passage embeddings come from the index's dense part when it was built with the same model (the stored fp16
vectors: what the encoder gave, rounded to fp16), otherwise the passages are embedded on the spot.
"""
from __future__ import annotations

import numpy as np

from indexer.reader import IndexReader
from ragserve.retrieval.dense import DENSE_DIR, DenseIndex, passage_text
from ragserve.retrieval.embedder import Embedder, EmbedderError
from ragserve.retrieval.searcher import Hit


class BiEncoderReranker:
    kind = "bi-encoder"

    def __init__(self, embedder: Embedder, index: IndexReader | None = None) -> None:
        self.embedder = embedder
        self.name = embedder.info.name
        self.stored: np.ndarray | None = None
        if index is not None and (index.path / DENSE_DIR).is_dir():
            dense = DenseIndex(index)
            try:
                embedder.check_same_model(dense.encoder, "the dense part")
                self.stored = dense.embeddings
            except EmbedderError:
                pass  # another model's embeddings: embed the passages instead

    def passage_vectors(self, hits: list[Hit]) -> np.ndarray:
        if self.stored is not None:
            return np.asarray(self.stored[np.asarray([h.docid for h in hits], dtype=np.int64)], dtype=np.float32)
        return self.embedder.encode([passage_text(h.title, h.text) for h in hits])

    def rescore(self, query: str, hits: list[Hit]) -> np.ndarray:
        """The model's relevance of each hit to the query (f32), in the hits' order."""
        return self.rescore_batch([query], [hits])[0]

    def rescore_batch(self, queries: list[str], hits: list[list[Hit]]) -> list[np.ndarray]:
        qv = self.embedder.encode(queries)
        return [self.passage_vectors(hs) @ q if hs else np.zeros(0, np.float32) for q, hs in zip(qv, hits)]
