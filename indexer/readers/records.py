"""Mapping of one JSON object or table row to a document: the field conventions of the common corpus layouts.

- pyserini:   ``id``, ``contents``
- FlashRAG / pyserini DPR wiki (wiki18_100w): ``id``, ``contents`` = title line + newline + text, the title
  CSV-quoted (``"Title"``) when it has several words
- BEIR:       ``_id``, ``title``, ``text`` (extra keys such as ``metadata`` are ignored)
- Wikipedia articles, i.e. WikiExtractor ``--json`` and HF ``wikimedia/wikipedia``: exactly ``id``, ``url``,
  ``title``, ``text`` (WikiExtractor 3 adds ``revid``); WikiExtractor repeats the title as the first line of
  ``text``, which is dropped. These are whole articles, so they are split into passages.
- generic:    id from ``id`` / ``docid`` / ``_id``, ``title`` optional, text from ``text`` / ``contents``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from indexer.readers.model import MalformedRecord

ID_FIELDS = ("id", "docid", "_id")
TEXT_FIELDS = ("text", "contents")
TITLE_FIELD = "title"
_ARTICLE_FIELDS = frozenset({"id", "url", "title", "text"})
_ARTICLE_OPTIONAL = frozenset({"revid"})


@dataclass
class Fields:
    id: str
    title: str
    text: str
    article: bool  # a whole Wikipedia article (to be split into passages)


def is_article_schema(names: set[str] | frozenset[str]) -> bool:
    """True for the field set of Wikipedia article dumps (WikiExtractor --json, wikimedia/wikipedia)."""
    return _ARTICLE_FIELDS <= names <= _ARTICLE_FIELDS | _ARTICLE_OPTIONAL


def first_present(names: Any, candidates: tuple[str, ...]) -> str | None:
    for c in candidates:  # a loop, not next(genexpr): this runs twice per record
        if c in names:
            return c
    return None


def to_fields(record: Any, article: bool | None = None) -> Fields:
    """The document of one record; raises MalformedRecord when it has no usable id or text. ``article`` says
    whether it is a whole Wikipedia article; None infers it from the record's keys."""
    if not isinstance(record, dict):
        raise MalformedRecord(f"expected a JSON object, got {type(record).__name__}")
    id_key = first_present(record, ID_FIELDS)
    text_key = first_present(record, TEXT_FIELDS)
    doc_id = record.get(id_key) if id_key else None
    if doc_id is None or doc_id == "" or isinstance(doc_id, (bool, dict, list)):
        raise MalformedRecord(f"no document id (one of {', '.join(ID_FIELDS)}); keys: {', '.join(record) or '-'}")
    text = record.get(text_key) if text_key else None
    if not isinstance(text, str):
        got = "missing" if text is None else f"a {type(text).__name__}"
        raise MalformedRecord(f"document {doc_id}: text (one of {', '.join(TEXT_FIELDS)}) is {got}")
    title = record.get(TITLE_FIELD)
    if title is None:
        title = ""
    elif not isinstance(title, str):
        raise MalformedRecord(f"document {doc_id}: title is a {type(title).__name__}, not a string")
    if article is None:
        article = "url" in record and is_article_schema(set(record))  # "url": skip building a set per record
    if article:
        text = drop_title_line(title, text)
    elif text_key == "contents" and TITLE_FIELD not in record:
        title, text = split_title_line(text)
    return Fields(str(doc_id), title, text, article)


def drop_title_line(title: str, text: str) -> str:
    """``text`` without a first line that only repeats the title (WikiExtractor writes one)."""
    first, sep, rest = text.partition("\n")
    if sep and title and first.strip() == title.strip():
        return rest.lstrip("\n")
    return text


def split_title_line(contents: str) -> tuple[str, str]:
    """(title, text) of ``contents`` that has no separate title: a first line followed by more lines is the
    title (FlashRAG/pyserini DPR layout), unquoted if CSV-quoted; single-line contents have no title. Nothing
    is lost for other layouts: the first line only moves to the title."""
    first, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents
    if len(first) >= 2 and first.startswith('"') and first.endswith('"'):
        first = first[1:-1].replace('""', '"')
    return first, rest
