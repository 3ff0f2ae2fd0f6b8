"""DPR-style passages: an article's words cut into consecutive chunks of ``passage_words`` words."""
from __future__ import annotations

from collections.abc import Iterator

from indexer.readers.model import Document


def split_passages(doc_id: str, title: str, text: str, passage_words: int) -> Iterator[Document]:
    """Passages ``<doc_id>_<n>`` (n from 0) of at most ``passage_words`` whitespace-separated words, joined by
    single spaces; the last may be shorter. ``passage_words=0`` yields the whole text as one document with id
    ``doc_id``. Text without any word yields nothing."""
    if passage_words < 0:
        raise ValueError(f"passage_words must be >= 0, got {passage_words}")
    if passage_words == 0:
        if text.strip():
            yield Document(doc_id, title, text)
        return
    words = text.split()
    for n, start in enumerate(range(0, len(words), passage_words)):
        yield Document(f"{doc_id}_{n}", title, " ".join(words[start:start + passage_words]))
