"""Index builds on Ray Data: the same index as ``indexer.writer.build_index``, byte for byte.

Each input file is a partition: a Ray Data task reads it with ``indexer.readers`` and cuts it into chunks of
``CHUNK_DOCS`` documents, which a pool of analysis actors tokenize and count (``ChunkAnalyser``: each result
carries its own terms, so it means the same whichever actor made it). The driver takes the chunks in input order
(Ray Data's ``preserve_order``), assigns docids and term ids and computes the global df / doc count / avgdl as
the local build does, and each shard is then written by a Ray task (``write_shard_job``). The index files are
those of the local build with the same shard plan (``--block-size`` / ``--bank-bytes``): the only manifest fields
that differ are ``build_seconds`` and ``created``, which record when and how long the build ran.
"""
from __future__ import annotations

import logging
import pickle
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

from indexer.analysis import CHUNK_DOCS, ChunkAnalyser
from indexer.analyzer import Analyzer
from indexer.options import BuildError, BuildOptions
from indexer.readers import CorpusError, ReadStats, iter_documents
from indexer.readers.model import MAX_ERRORS
from indexer.packing import ShardInputs, ShardJob, write_shard_job
from indexer.writer import build_index_from_analysed, read_counts
from ragserve.distributed import connect

# Fields of the manifest that describe the build rather than the index (FORMAT.md): the rest is identical.
BUILD_FIELDS = ("build_seconds", "created")


def build_index_ray(inputs: list[str | Path], out_dir: str | Path, options: BuildOptions | None = None,
                    fmt: str = "auto", on_error: str = "skip", passage_words: int = 100, address: str = "local",
                    workers: int = 0) -> dict:
    """``build_index`` on the Ray cluster at ``address`` (``local``: one started here); ``workers`` analysis
    actors (default: the cluster's CPUs less one, which reading keeps). Returns the manifest."""
    ray = connect(address)
    paths = [str(p) for p in inputs]
    iter_documents(paths, fmt=fmt, on_error=on_error, passage_words=passage_words)  # bad arguments fail here
    opts = options or BuildOptions()
    cpus = int(ray.cluster_resources().get("CPU", 1))
    n_workers = workers or max(1, cpus - 1)
    ctx = ray.data.DataContext.get_current()
    saved = ctx.execution_options.preserve_order, ctx.enable_progress_bars, ctx.target_max_block_size
    ctx.execution_options.preserve_order = True  # the driver must see chunks in input order (docids)
    ctx.enable_progress_bars = opts.progress
    ctx.target_max_block_size = 1  # one chunk a block: a block is the unit handed to an analysis actor
    # Ray Data logs its plan, and a failed task's remote traceback; the build reports errors itself.
    data_log = logging.getLogger("ray.data")
    saved_level = data_log.level
    data_log.setLevel(logging.CRITICAL)
    try:
        files = ray.data.from_items([{"file": i} for i in range(len(paths))], override_num_blocks=len(paths))
        # Reading asks for less CPU than analysis, so Ray Data does not fuse the two stages into one actor
        # (which would analyse each file on one worker only).
        docs = files.flat_map(_read_partition, num_cpus=0.5, fn_kwargs={
            "paths": paths, "fmt": fmt, "on_error": on_error, "passage_words": passage_words})
        analysed = docs.map(_Analyse, fn_constructor_args=(Analyzer(opts.analyzer).config_dict(),), num_cpus=1,
                            compute=ray.data.ActorPoolStrategy(size=n_workers))
        source: dict = {"inputs": paths, "format": fmt}

        def chunks() -> Iterator[tuple]:
            stats = ReadStats()
            for row in analysed.iter_rows():
                if row["kind"] == "stats":
                    _merge_stats(stats, pickle.loads(row["payload"]))
                else:
                    yield pickle.loads(row["payload"])
            source.update(read_counts(stats))

        manifest = build_index_from_analysed(chunks(), out_dir, opts, source, shard_writer=_shard_writer(ray))
    except Exception as e:
        cause = _user_error(e)
        if cause is not None:  # Ray Data appends its retry advice to the message: the first line is ours
            raise type(cause)(str(cause).splitlines()[0]) from None
        raise
    finally:
        ctx.execution_options.preserve_order, ctx.enable_progress_bars, ctx.target_max_block_size = saved
        data_log.setLevel(saved_level)
    return manifest


def _read_partition(row: dict, paths: list[str], fmt: str, on_error: str, passage_words: int) -> Iterator[dict]:
    """One input file as chunks of documents, then the reader's counts for it."""
    stats = ReadStats()
    docs = iter_documents([paths[row["file"]]], fmt=fmt, on_error=on_error, stats=stats, passage_words=passage_words)
    while batch := list(islice(docs, CHUNK_DOCS)):
        chunk = ([str(d.id) for d in batch], [d.title or "" for d in batch], [d.text or "" for d in batch])
        yield {"kind": "docs", "payload": pickle.dumps(chunk, protocol=5)}
    yield {"kind": "stats", "payload": pickle.dumps(stats, protocol=5)}


class _Analyse:
    """An analysis actor: its tokenizer tables and caches live as long as it does."""

    def __init__(self, analyzer_config: dict) -> None:
        self.analyse = ChunkAnalyser(analyzer_config)

    def __call__(self, row: dict) -> dict:
        if row["kind"] != "docs":
            return row
        return {"kind": "chunk", "payload": pickle.dumps(self.analyse(*pickle.loads(row["payload"])), protocol=5)}


def _merge_stats(total: ReadStats, part: ReadStats) -> None:
    """Add one file's counts, as one ReadStats shared by the files in order would have them."""
    for name in ("records", "skipped", "filtered", "documents", "invalid_utf8", "error_count"):
        setattr(total, name, getattr(total, name) + getattr(part, name))
    total.errors.extend(part.errors[:MAX_ERRORS - len(total.errors)])
    total.truncated.extend(part.truncated)


def _shard_writer(ray):
    """Each shard written by a Ray task; results in shard order."""
    task = ray.remote(num_cpus=1)(write_shard_job)

    def write(jobs: list[ShardJob], inputs: ShardInputs) -> Iterable[tuple]:
        shared = ray.put(inputs)  # the term map and norms go to the object store once, not once per shard
        pending = [task.remote(job, shared) for job in jobs]
        for ref in pending:
            yield ray.get(ref)

    return write


def _user_error(e: BaseException | None) -> BaseException | None:
    """The corpus or build error inside a Ray task's error, to report it as the local build does. (Ray's
    ``RayTaskError(CorpusError)`` is a CorpusError too, but its message is the remote traceback: take its
    ``cause``.)"""
    for _ in range(20):
        if e is None:
            return None
        cause = getattr(e, "cause", None)
        if isinstance(e, (CorpusError, BuildError)) and not isinstance(cause, BaseException):
            return e
        e = cause if isinstance(cause, BaseException) else e.__cause__
    return None
