"""Parquet and Arrow IPC files (the HF ``datasets`` storage formats, e.g. ``wikimedia/wikipedia``), read one
record batch at a time with pyarrow, only the needed columns. Positions in messages are 1-based row numbers."""
from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from indexer.readers.jsonl import record_documents
from indexer.readers.model import Document, ReadContext
from indexer.readers.records import ID_FIELDS, TEXT_FIELDS, TITLE_FIELD, first_present, is_article_schema
from indexer.readers.source import open_raw

_BATCH_ROWS = 1024
ARROW_FILE_MAGIC = b"ARROW1"
ARROW_STREAM_MAGIC = b"\xff\xff\xff\xff"  # continuation marker that starts every IPC stream message


def _columns(ctx: ReadContext, schema: pa.Schema) -> tuple[list[str], bool]:
    """The columns to read (id, text, title if any) and whether rows are whole Wikipedia articles."""
    names = list(schema.names)
    id_col, text_col = first_present(names, ID_FIELDS), first_present(names, TEXT_FIELDS)
    if id_col is None or text_col is None:
        missing = [f"one of {'/'.join(c)}" for c, got in ((ID_FIELDS, id_col), (TEXT_FIELDS, text_col)) if not got]
        raise ctx.fatal(f"missing required column {' and '.join(missing)}; columns found: {', '.join(names) or '-'}")
    wanted = [id_col, text_col] + ([TITLE_FIELD] if TITLE_FIELD in names else [])
    return wanted, is_article_schema(set(names))


def _rows(ctx: ReadContext, batches: Iterator[pa.RecordBatch], article: bool, passage_words: int
          ) -> Iterator[Document]:
    row = 0
    for batch in batches:
        for record in batch.to_pylist():
            row += 1
            # Only the needed columns were read, so whether rows are articles comes from the full schema.
            yield from record_documents(ctx, record, row, passage_words, article)


def read_parquet(ctx: ReadContext, passage_words: int) -> Iterator[Document]:
    with open_raw(ctx.path, ctx.stats) as f:
        try:
            pf = pq.ParquetFile(f)
        except (pa.ArrowException, OSError) as e:
            raise ctx.fatal(f"not a readable Parquet file: {e}") from e
        columns, article = _columns(ctx, pf.schema_arrow)
        try:
            yield from _rows(ctx, pf.iter_batches(batch_size=_BATCH_ROWS, columns=columns), article, passage_words)
        except (pa.ArrowException, OSError) as e:
            raise ctx.fatal(f"unreadable Parquet data: {e}") from e


def read_arrow(ctx: ReadContext, passage_words: int) -> Iterator[Document]:
    """Arrow IPC file (``ARROW1`` magic) or stream format (what ``datasets`` writes to its cache)."""
    with open_raw(ctx.path, ctx.stats) as f:
        try:
            if f.peek(len(ARROW_FILE_MAGIC)).startswith(ARROW_FILE_MAGIC):
                reader = ipc.open_file(f)
                batches: Iterator[pa.RecordBatch] = (reader.get_batch(i) for i in range(reader.num_record_batches))
                schema = reader.schema
            else:
                stream = ipc.open_stream(f)
                batches, schema = iter(stream), stream.schema
        except (pa.ArrowException, OSError) as e:
            raise ctx.fatal(f"not a readable Arrow IPC file: {e}") from e
        columns, article = _columns(ctx, schema)
        try:
            yield from _rows(ctx, (b.select(columns) for b in batches), article, passage_words)
        except (pa.ArrowException, OSError) as e:
            raise ctx.fatal(f"unreadable Arrow data: {e}") from e
