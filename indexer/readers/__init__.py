"""Streaming corpus readers: every supported corpus layout as one stream of ``Document(id, title, text)``.

``iter_documents(paths, fmt="auto", on_error="skip", stats=None, passage_words=100)`` checks its arguments and
every input (exists, not empty, known format) when called, then returns a lazy iterator. Formats (``FORMATS``):

- ``dpr-tsv``: DPR ``psgs_w100.tsv`` (header ``id text title``, CSV-quoted fields)
- ``jsonl``: JSON lines or one JSON array of pyserini, BEIR, FlashRAG, WikiExtractor or generic records (see
  ``records.py``)
- ``hf``: HF ``datasets`` files, Parquet or Arrow, same column conventions
- ``mediawiki``: MediaWiki ``pages-articles`` dumps
- ``wikiextractor``: WikiExtractor ``--json`` output, every record a whole article (``jsonl`` infers that from
  the record's keys)

The earlier names ``json``, ``parquet``, ``arrow`` and ``mediawiki-xml`` are aliases (``ALIASES``).

Whole Wikipedia articles (XML pages, WikiExtractor / ``wikimedia/wikipedia`` records) are cut into passages of
``passage_words`` words with ids ``<id>_<n>``; ``passage_words=0`` keeps them whole. Other records are documents
as they are. gzip and bzip2 inputs are decompressed transparently (detected by magic bytes); invalid UTF-8 is
replaced and counted in ``stats.invalid_utf8``.

Errors: a malformed record raises ``CorpusError`` naming file and line under ``on_error="fail"``, and is counted
and recorded in ``stats`` under ``"skip"``. A file that cannot be read as a whole (missing, empty, unknown format,
corrupt compressed data, XML not well-formed, Parquet without id/text columns) raises ``CorpusError`` under
both. A truncated gzip/bzip2 stream: the documents before the cut are yielded, then it raises under ``"fail"``
and under ``"skip"`` is recorded in ``stats.errors`` and ``stats.truncated`` before reading goes on with the next
file.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from indexer.readers.detect import ALIASES, FORMAT_HELP, FORMATS, RANDOM_ACCESS, canonical_format, detect_format
from indexer.readers.jsonl import read_json
from indexer.readers.mediawiki import read_mediawiki
from indexer.readers.model import ON_ERROR, CorpusError, Document, ReadContext, ReadError, ReadStats
from indexer.readers.source import compression_of, sniff
from indexer.readers.table import ARROW_FILE_MAGIC, ARROW_STREAM_MAGIC, read_arrow, read_parquet
from indexer.readers.tsv import read_dpr_tsv

__all__ = ["ALIASES", "FORMATS", "FORMAT_HELP", "CorpusError", "Document", "ReadError", "ReadStats",
           "canonical_format", "iter_documents"]


def _plan(path: Path, fmt: str) -> tuple[Path, str, str | None]:
    """(path, format, compression) of one input, or CorpusError for an input that cannot be read at all."""
    if not path.exists():
        raise CorpusError(f"{path}: no such file")
    if not path.is_file():
        raise CorpusError(f"{path}: not a regular file (pass the files of a directory, not the directory)")
    if path.stat().st_size == 0:
        raise CorpusError(f"{path}: empty file")
    compression = compression_of(path)
    if compression and not sniff(path, compression):
        raise CorpusError(f"{path}: empty file (nothing after {compression} decompression)")
    fmt = detect_format(path, compression) if fmt == "auto" else fmt
    if compression and fmt in RANDOM_ACCESS:
        raise CorpusError(f"{path}: {fmt} files cannot be {compression}-compressed (they need random access)")
    return path, fmt, compression


def iter_documents(paths: list[str | Path], fmt: str = "auto", on_error: str = "skip",
                   stats: ReadStats | None = None, passage_words: int = 100) -> Iterator[Document]:
    """Documents of all ``paths`` in order. Argument and input checks raise here, at the call; reading is lazy
    and streams (memory bounded by the largest record). ``stats`` (if given) is updated as reading goes."""
    fmt = canonical_format(fmt)
    if fmt != "auto" and fmt not in FORMATS:
        raise CorpusError(f"unknown corpus format {fmt!r}; use auto or one of {', '.join(FORMATS)}")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    if isinstance(passage_words, bool) or not isinstance(passage_words, int) or passage_words < 0:
        raise ValueError(f"passage_words must be an integer >= 0, got {passage_words!r}")
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise CorpusError("no corpus files given")
    plans = [_plan(Path(p), fmt) for p in paths]
    stats = stats if stats is not None else ReadStats()
    stats.bytes_total += sum(path.stat().st_size for path, _, _ in plans)
    return _read_all(plans, on_error, stats, passage_words)


def _read_all(plans: list[tuple[Path, str, str | None]], on_error: str, stats: ReadStats,
              passage_words: int) -> Iterator[Document]:
    for path, fmt, compression in plans:
        ctx = ReadContext(path, stats, on_error, unit="row" if fmt in RANDOM_ACCESS else "line")
        before = stats.records + stats.skipped
        for doc in _reader(ctx, fmt, compression, passage_words):
            stats.documents += 1
            yield doc
        if stats.records + stats.skipped == before and not ctx.truncated:
            raise ctx.fatal(f"no records found (read as {fmt})")


def _reader(ctx: ReadContext, fmt: str, compression: str | None, passage_words: int) -> Iterator[Document]:
    if fmt == "dpr-tsv":
        return read_dpr_tsv(ctx, compression)
    if fmt in ("jsonl", "wikiextractor"):
        return read_json(ctx, compression, passage_words, article=True if fmt == "wikiextractor" else None)
    if fmt == "hf":  # Arrow IPC by its magic bytes; anything else goes to the Parquet reader, which says why not
        with open(ctx.path, "rb") as f:
            head = f.read(len(ARROW_FILE_MAGIC))
        arrow = head.startswith(ARROW_FILE_MAGIC) or head.startswith(ARROW_STREAM_MAGIC)
        return read_arrow(ctx, passage_words) if arrow else read_parquet(ctx, passage_words)
    return read_mediawiki(ctx, compression, passage_words)
