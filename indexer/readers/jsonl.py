"""JSON corpora: JSON lines (one object per line) and JSON arrays of objects, both read incrementally."""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from indexer.readers.model import Document, MalformedRecord, ReadContext
from indexer.readers.passages import split_passages
from indexer.readers.records import to_fields
from indexer.readers.source import iter_lines

_decoder = json.JSONDecoder()
# An array element still undecodable after this many characters is taken as broken, not as incomplete.
MAX_ELEMENT_CHARS = 256 << 20


def record_documents(ctx: ReadContext, record: object, line: int, passage_words: int,
                     article: bool | None = None) -> Iterator[Document]:
    """Documents of one parsed record (several passages for a whole article); a bad record goes to ``ctx``."""
    try:
        fields = to_fields(record, article)
    except MalformedRecord as e:
        ctx.malformed(line, str(e))
        return
    ctx.stats.records += 1
    if not fields.article:
        yield Document(fields.id, fields.title, fields.text)
        return
    produced = 0
    for doc in split_passages(fields.id, fields.title, fields.text, passage_words):
        produced += 1
        yield doc
    if not produced:
        ctx.stats.filtered += 1


def _jsonl(ctx: ReadContext, lines: Iterable[tuple[int, str]], passage_words: int,
           article: bool | None) -> Iterator[Document]:
    for line, text in lines:
        if not text or text.isspace():  # not text.strip(), which copies every line
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            ctx.malformed(line, f"broken JSON: {e.msg} at column {e.colno}")
            continue
        yield from record_documents(ctx, record, line, passage_words, article)


def read_json(ctx: ReadContext, compression: str | None, passage_words: int,
              article: bool | None = None) -> Iterator[Document]:
    """JSON lines, or a JSON array of record objects (as HF ``datasets``' json loader accepts both). ``article``:
    whether records are whole Wikipedia articles (None: inferred from each record's keys).

    An array is decoded one element at a time: lines are added to a buffer until the pending element
    decodes. A syntax error in the array itself cannot be resynchronised, so it is fatal in both modes."""
    lines = iter_lines(ctx, compression)
    for line, text in lines:
        if text.strip():
            break
    else:
        raise ctx.fatal("no JSON content")
    if not text.lstrip().startswith("["):
        yield from _jsonl(ctx, _chain_first((line, text), lines), passage_words, article)
        return
    buf = text[text.index("[") + 1:]
    buf_line = line  # line number of buf[0]
    expect_value = True  # after "[" or ",": an element (or "]" for an empty array)
    closed = False
    retry = True  # whether the buffer may now hold a complete element
    while True:
        # Consume every complete element already in the buffer.
        while not closed and retry:
            stripped = buf.lstrip()
            buf_line += buf.count("\n", 0, len(buf) - len(stripped))
            buf = stripped
            if not buf:
                break
            if buf[0] == "]":
                closed, buf = True, buf[1:]
                break
            if not expect_value:
                if buf[0] != ",":
                    raise ctx.fatal(f"JSON array: expected ',' or ']', found {buf[:20]!r}", buf_line)
                buf, expect_value = buf[1:], True
                continue
            try:
                record, end = _decoder.raw_decode(buf)
            except json.JSONDecodeError:
                break  # incomplete: wait for more lines
            yield from record_documents(ctx, record, buf_line, passage_words, article)
            buf_line += buf.count("\n", 0, end)
            buf, expect_value = buf[end:], False
        nxt = next(lines, None)
        if nxt is None:
            break
        line, text = nxt
        if closed:
            if text.strip():
                raise ctx.fatal("JSON array: content after the closing ']'", line)
            continue
        buf += text
        # An object ends with '}'; other elements end before ',' or ']'. Re-decoding only then keeps the cost
        # linear in practice.
        retry = any(c in text for c in "}],")
        if len(buf) > MAX_ELEMENT_CHARS:
            raise ctx.fatal(f"broken JSON array: no complete element within {MAX_ELEMENT_CHARS} characters",
                            buf_line)
    if ctx.truncated:
        return
    if not closed:
        try:
            _decoder.raw_decode(buf)
            problem = "the array is not closed with ']'"
        except json.JSONDecodeError as e:
            problem = f"{e.msg}"
        raise ctx.fatal(f"broken JSON array: {problem}", buf_line)


def _chain_first(first: tuple[int, str], rest: Iterator[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    yield first
    yield from rest
