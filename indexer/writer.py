"""Index builds: documents -> the sharded, block-partitioned BM25 index of ``indexer/FORMAT.md``.

The stages: analysis (``indexer/analysis.py``: worker processes tokenize and count postings), ingest
(``indexer/ingest.py``: docids, provisional term ids, stored text and runs of postings on disk) and layout
(``indexer/packing.py``: sorted vocabulary, shard plan, packed postings, block tables, manifest). Everything is
written under a temporary directory that is renamed into place only when complete.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

from indexer.analysis import analyse_documents
from indexer.analyzer import Analyzer
from indexer.files import write_dir_atomically
from indexer.ingest import ingest
from indexer.options import BuildError, BuildOptions
from indexer.packing import ShardInputs, ShardJob, write_layout


def build_index_from_documents(documents: Iterable, out_dir: str | Path, options: BuildOptions | None = None,
                               source: dict | None = None, read_stats=None) -> dict:
    """Index an iterable of objects with ``id``, ``title``, ``text`` into ``out_dir``; returns the manifest.

    ``read_stats`` (an ``indexer.readers.ReadStats``), when given, drives the progress bar in input bytes.
    """
    opts = options or BuildOptions()
    analyzer = Analyzer(opts.analyzer)
    return _build_into(out_dir, opts, lambda tmp: _build(
        analyse_documents(documents, analyzer, opts.workers or os.cpu_count() or 1), tmp, opts, analyzer,
        source or {}, read_stats))


def build_index_from_analysed(chunks: Iterable[tuple], out_dir: str | Path, options: BuildOptions | None = None,
                              source: dict | None = None,
                              shard_writer: Callable[[list[ShardJob], ShardInputs], Iterable[tuple]] | None = None
                              ) -> dict:
    """Index chunks analysed elsewhere (``ChunkAnalyser`` results, in input order: chunk boundaries do not
    matter) into ``out_dir``; returns the manifest. ``shard_writer`` runs ``write_shard_job`` for every job,
    anywhere that sees the same files, and yields its results in job order (default: here, one shard at a
    time). ``source`` may be filled in until ``chunks`` is exhausted. The files are those of
    ``build_index_from_documents`` over the same documents and options."""
    opts = options or BuildOptions()
    analyzer = Analyzer(opts.analyzer)
    return _build_into(out_dir, opts, lambda tmp: _build(chunks, tmp, opts, analyzer, source if source is not None
                                                         else {}, None, shard_writer))


def _build_into(out_dir: str | Path, opts: BuildOptions, build: Callable[[Path], dict]) -> dict:
    """Run ``build`` on a temporary directory next to ``out_dir`` and rename it into place when complete."""
    bs = opts.block_size
    if bs <= 0 or bs & (bs - 1):
        raise BuildError(f"block size must be a power of two, got {bs}")
    if opts.fine_block < 1:
        raise BuildError(f"fine block size must be at least 1 posting, got {opts.fine_block}")
    out = Path(out_dir)
    if out.exists() and not opts.overwrite:
        raise BuildError(f"{out} already exists (pass --overwrite to replace it)")
    return write_dir_atomically(out, build)


def _build(chunks: Iterable[tuple], tmp: Path, opts: BuildOptions, analyzer: Analyzer, source: dict, read_stats=None,
           shard_writer: Callable[[list[ShardJob], ShardInputs], Iterable[tuple]] | None = None) -> dict:
    t_start = time.time()
    ing = ingest(chunks, tmp, opts, read_stats)
    if ing.num_docs == 0:
        raise BuildError("no documents were read from the input")
    return write_layout(ing, tmp, opts, analyzer, source, t_start, shard_writer)


def build_index(inputs: list[str | Path], out_dir: str | Path, options: BuildOptions | None = None,
                fmt: str = "auto", on_error: str = "skip", passage_words: int = 100) -> dict:
    """Read corpus files with ``indexer.readers`` and index them; returns the manifest."""
    from indexer.readers import ReadStats, iter_documents

    stats = ReadStats()
    docs = iter_documents([str(p) for p in inputs], fmt=fmt, on_error=on_error, stats=stats,
                          passage_words=passage_words)

    # The manifest is written after the input is exhausted, so the reader's counts are final by then.
    source: dict = {"inputs": [str(p) for p in inputs], "format": fmt}

    def counted() -> Iterator:
        yield from docs
        source.update(read_counts(stats))

    return build_index_from_documents(counted(), out_dir, options, source, read_stats=stats)


def read_counts(stats) -> dict:
    """The reader's final counts (an ``indexer.readers.ReadStats``) as the manifest's ``source`` records them."""
    return dict(records=stats.records, documents=stats.documents, skipped=stats.skipped, filtered=stats.filtered,
                invalid_utf8=stats.invalid_utf8, error_count=stats.error_count, truncated=list(stats.truncated),
                errors=[f"{e.file}:{e.line}: {e.message}" for e in stats.errors[:100]])
