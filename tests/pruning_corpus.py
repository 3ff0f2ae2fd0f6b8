"""A corpus where the gpu backend's pruning must leave tiles out: a term in every doc, one in every third, and
rare terms. For a top-k of a query holding a rare term, the rare term's tiles (the pilot pass) hold docs scoring
more than the common terms' weights together, so the tiles with only common terms are never scored."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from indexer.reader import IndexReader
from indexer.writer import BuildOptions, build_index_from_documents

QUERIES = ["common mid rare", "common rare", "mid rare common often", "often common", "common"]


@dataclass
class Doc:
    id: str
    title: str
    text: str


def pruning_index(path: Path) -> IndexReader:
    """6,000 docs in blocks (and tiles) of 64 docs over several shards; ``rare`` is in 12 docs, ``often`` in 60."""
    docs = []
    for i in range(6000):
        words = ["common"] * (1 + i % 3) + (["mid"] if i % 3 == 0 else []) + (["often"] if i % 100 == 41 else [])
        words += ["rare"] * (1 + i % 2) if i % 500 == 7 else []
        docs.append(Doc(f"d{i}", "", " ".join(words + ["filler"] * (i % 7))))
    build_index_from_documents(docs, path, BuildOptions(block_size=64, bank_bytes=24 << 10, progress=False))
    return IndexReader(path)
