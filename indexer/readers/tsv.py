"""DPR passage TSV (``psgs_w100.tsv``): header ``id<TAB>text<TAB>title``, then one passage per row.

Fields follow the DPR release's CSV conventions (DPR reads it with ``csv.reader(delimiter="\\t")``): a field may
be double-quoted, with ``""`` for a quote inside, and a quoted field may span lines."""
from __future__ import annotations

import csv
from collections.abc import Iterator

from indexer.readers.model import Document, ReadContext
from indexer.readers.source import iter_lines

DPR_HEADER = ["id", "text", "title"]


def read_dpr_tsv(ctx: ReadContext, compression: str | None) -> Iterator[Document]:
    rows = csv.reader((text for _, text in iter_lines(ctx, compression)), delimiter="\t")
    line = 0  # last line consumed by the csv reader
    header_seen = False
    while True:
        start = line + 1
        try:
            row = next(rows)
        except StopIteration:
            break
        except csv.Error as e:  # e.g. an unterminated quote running past the field size limit
            line = rows.line_num
            ctx.malformed(start, f"bad CSV quoting: {e}{_span(start, line)}")
            continue
        line = rows.line_num
        if not header_seen:
            if [c.strip().lstrip("\ufeff") for c in row] != DPR_HEADER:
                raise ctx.fatal(f"not a DPR passage TSV (header id<TAB>text<TAB>title): the first line is "
                                f"{_excerpt(row)}{_json_hint(row)}", start)
            header_seen = True
            continue
        if not row:  # a blank line
            continue
        if len(row) != len(DPR_HEADER):
            ctx.malformed(start, f"expected 3 tab-separated fields (id, text, title), found {len(row)}"
                                 f"{_span(start, line)}")
            continue
        doc_id, text, title = row
        if not doc_id.strip():
            ctx.malformed(start, "empty id")
            continue
        ctx.stats.records += 1
        yield Document(doc_id.strip(), title, text)


def _excerpt(row: list[str], limit: int = 60) -> str:
    """The start of a record, quoted: a whole passage (thousands of characters) would bury the message."""
    text = "\t".join(row)
    return repr(text[:limit]) + "..." if len(text) > limit else repr(text)


def _json_hint(row: list[str]) -> str:
    return "; this looks like JSON lines: try --format jsonl" if row and \
        row[0].lstrip().startswith("{") else ""


def _span(start: int, end: int) -> str:
    """Where a record spread over several lines (a quoted field can hold newlines) ends: what was lost."""
    return f" (lines {start}-{end} form this one record)" if end > start else ""
