"""BM25 engines behind one small interface, for side-by-side speed runs (``scripts/bench_search.py``).

Each engine builds an index of a stream of ``Document(id, title, text)`` (title and text indexed as one field,
as Anserini's BEIR flat index does) into a directory, and later opens it to answer queries. ``search`` returns
what the engine natively returns for a query (the timed part); ``ids`` turns that into external document ids
(not timed, for the agreement check).

- ``ragserve``: this project's CPU backend (``Searcher(backend="cpu")``: its analyzer, then the backend), Lucene-exact
  BM25; ``search`` returns ranked internal ids and scores.
- ``pyserini``: pyserini 1.6.0 ``LuceneSearcher`` (Anserini SimpleSearcher over Lucene 9.9.1), indexed with
  Anserini's ``IndexCollection`` (BEIR flat collection, ``-threads``).
- ``bm25s``: bm25s 0.3.16 with its numba backend and its own tokenizer (English stopwords, Snowball English
  stemmer), method "lucene"; ``bm25s-ours`` gets the token lists of this project's analyzer instead.
- ``pisa``: PISA through pyterrier-pisa 0.4.9's C++ extension ``_pisathon`` called directly (porter2, Lucene's
  stopwords, block_simdbp lists with 64-posting block maxima; block-max WAND, and as variants MaxScore and
  block-max MaxScore on the same index). Without pyterrier installed, the extension
  and the libtbb.so.2 it links are loaded from ``$RAGSERVE_PEERS_SITE`` (``tools/peers/install_peers.sh``).
- ``tantivy``: tantivy-py 0.27.0, ``en_stem`` tokenizer, frequencies without positions; its BM25 has fixed
  k1=1.2, b=0.75 (also found in ``$RAGSERVE_PEERS_SITE``).
- ``rank-bm25``: rank-bm25 0.2.2 ``BM25Okapi`` over this project's tokens; in memory only and O(N) per query.

``variants`` lists what an engine can time per query: its ``search`` (query text to ranked ids), and where it has
them, its scoring alone on a query prepared beforehand (``ragserve``: the cpu backend on the analysed terms;
``bm25s``: ``retrieve`` on the tokens; ``pyserini``: Lucene's IndexSearcher without the pyserini wrapper, the
query parsed by Lucene's analyzer inside the call) and other algorithms on the same index (PISA).
"""
from __future__ import annotations

import ctypes
import json
import os
import pickle
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from indexer.readers import Document

K1, B = 0.9, 0.4


def doc_text(d: Document) -> str:
    return f"{d.title} {d.text}" if d.title else d.text


class Engine:
    name = ""
    threads = 2
    max_queries: int | None = None  # cap on timed / compared queries for very slow engines

    def build(self, docs: Iterable[Document], out: Path, corpus: Path) -> dict:
        """Index ``docs`` (the parsed ``corpus`` file) into ``out``; returns extra facts for the report."""
        raise NotImplementedError

    def open(self, out: Path) -> None:
        raise NotImplementedError

    def search(self, query: str, k: int) -> Any:
        raise NotImplementedError

    def batch(self, queries: list[str], k: int) -> Any:
        """All queries at once with the engine's own parallelism (``threads``)."""
        return [self.search(q, k) for q in queries]

    def ids(self, result: Any) -> list[str]:
        raise NotImplementedError

    def variants(self) -> list[tuple[str, Callable[[str], Any], Callable[[Any, int], Any]]]:
        """(label, prepare a query text (not timed), search a prepared query for its top k (timed))."""
        return [(self.name, _same, self.search)]


def _same(query: str) -> str:
    return query


def peers_site() -> None:
    """Make the peers installed apart (``$RAGSERVE_PEERS_SITE``: tantivy, PISA's extension) importable, after
    this environment's own packages."""
    site = os.environ.get("RAGSERVE_PEERS_SITE")
    if site and site not in sys.path:
        sys.path.append(site)


def pisathon():
    """PISA's Python extension: pyterrier-pisa's if that package is installed, else the one in
    ``$RAGSERVE_PEERS_SITE`` (with the libtbb.so.2 beside it loaded first)."""
    import importlib.util

    if importlib.util.find_spec("pyterrier_pisa") is not None:
        from pyterrier_pisa import _pisathon

        return _pisathon
    peers_site()
    site = os.environ.get("RAGSERVE_PEERS_SITE")
    if site and Path(site, "libtbb.so.2").is_file():
        ctypes.CDLL(str(Path(site, "libtbb.so.2")), mode=ctypes.RTLD_GLOBAL)
    import _pisathon

    return _pisathon


class Ragserve(Engine):
    name = "ragserve"

    def build(self, docs, out, corpus):
        from indexer.options import BuildOptions
        from indexer.writer import build_index

        # What ``ragserve index`` runs: its own reader, parsing included in the time.
        m = build_index([corpus], out, BuildOptions(progress=False, workers=self.threads))
        return {"postings": m["stats"]["num_postings"], "vocab": m["stats"]["vocab_size"]}

    def open(self, out):
        from ragserve.retrieval.searcher import Searcher

        self.searcher = Searcher(out, backend="cpu", threads=self.threads)

    def search(self, query, k):
        # Query text to ranked internal ids and scores, as bm25s, Lucene's IndexSearcher and tantivy return them
        # (Searcher.search also builds a Hit object with the external id for each).
        ix = self.searcher.index
        return self.searcher.backend.search_terms([self.searcher.analyze(query)], k, ix.k1, ix.b)[0]

    def batch(self, queries, k):
        return self.searcher.search_batch(queries, k, with_text=False)

    def ids(self, result):
        if isinstance(result, list):
            return [h.id for h in result]
        return [self.searcher.index.external_id(int(d)) for d in result.docids]

    def variants(self):
        ix = self.searcher.index
        backend = self.searcher.backend
        return super().variants() + [("ragserve (analysed query)", self.searcher.analyze,
                                      lambda terms, k: backend.search_terms([terms], k, ix.k1, ix.b)[0])]


class Pyserini(Engine):
    name = "pyserini"

    def build(self, docs, out, corpus):
        from tools.peers import lucene

        # Anserini's BEIR collection reads ``_id``; IndexCollection runs one thread per input file, so the
        # corpus is written out as one BEIR file per thread (not timed: format preparation).
        lucene.start_jvm()
        parts = out.parent / (out.name + ".input")
        shutil.rmtree(parts, ignore_errors=True)
        parts.mkdir(parents=True)
        files = [open(parts / f"part{i}.jsonl", "w", encoding="utf-8") for i in range(self.threads)]
        for i, d in enumerate(docs):
            rec = {"_id": d.id, "title": d.title, "text": d.text}
            files[(i // 10_000) % self.threads].write(json.dumps(rec) + "\n")
        for f in files:
            f.close()
        try:
            # One merged segment, as prebuilt indexes are: Lucene's fastest layout for searching.
            secs = lucene.index_beir_dir(parts, out, threads=self.threads, optimize=True)
        finally:
            shutil.rmtree(parts, ignore_errors=True)
        return {"index_seconds": secs}

    def open(self, out):
        from tools.peers import lucene

        self.ref = lucene.LuceneRef(out, K1, B)
        self.searcher = self.ref.pyserini

    def search(self, query, k):
        return self.searcher.search(query, k)

    def search_lucene(self, query, k):
        """Lucene's IndexSearcher alone (no pyserini wrapper, no id lookup)."""
        return self.ref.search_raw(query, k)

    def batch(self, queries, k):
        res = self.searcher.batch_search(queries, [str(i) for i in range(len(queries))], k=k, threads=self.threads)
        return [res[str(i)] for i in range(len(queries))]

    def ids(self, result):
        return [h.docid for h in result]

    def variants(self):
        return super().variants() + [("Lucene IndexSearcher", _same, self.search_lucene)]


class Bm25s(Engine):
    name = "bm25s"

    def _stemmer(self):
        import Stemmer

        if not hasattr(self, "_st"):
            self._st = Stemmer.Stemmer("english")
        return self._st

    def corpus_tokens(self, texts: list[str]) -> Any:
        import bm25s

        return bm25s.tokenize(texts, stopwords="en", stemmer=self._stemmer(), show_progress=False)

    def query_tokens(self, query: str) -> list[str]:
        import bm25s

        return bm25s.tokenize([query], stopwords="en", stemmer=self._stemmer(), show_progress=False,
                              return_ids=False)[0]

    def build(self, docs, out, corpus):
        import bm25s

        ids, texts = [], []
        for d in docs:
            ids.append(d.id)
            texts.append(doc_text(d))
        tokens = self.corpus_tokens(texts)
        del texts
        model = bm25s.BM25(k1=K1, b=B, method="lucene", backend="numba")
        model.index(tokens, show_progress=False)
        model.save(str(out))
        with open(out / "ids.pkl", "wb") as f:
            pickle.dump(ids, f)
        return {}

    def open(self, out):
        import bm25s

        self.model = bm25s.BM25.load(str(out), mmap=False)
        self.model.backend = "numba"
        self.model.activate_numba_scorer()
        with open(out / "ids.pkl", "rb") as f:
            self.doc_ids = pickle.load(f)

    def search(self, query, k):
        return self.model.retrieve([self.query_tokens(query)], k=k, n_threads=1, show_progress=False)

    def batch(self, queries, k):
        res = self.model.retrieve([self.query_tokens(q) for q in queries], k=k, n_threads=self.threads,
                                  show_progress=False)
        return [type(res)(documents=res.documents[i:i + 1], scores=res.scores[i:i + 1]) for i in range(len(queries))]

    def ids(self, result):
        return [self.doc_ids[int(i)] for i, s in zip(result.documents[0], result.scores[0]) if s > 0]

    def variants(self):
        return super().variants() + [(f"{self.name} (tokenized query)", self.query_tokens,
                                      lambda toks, k: self.model.retrieve([toks], k=k, n_threads=1,
                                                                          show_progress=False))]


class Bm25sOurs(Bm25s):
    """bm25s scoring the token lists of ragserve's analyzer (Lucene's), for a like-for-like comparison."""

    name = "bm25s-ours"

    def _analyzer(self):
        from indexer.analyzer import Analyzer

        if not hasattr(self, "_an"):
            self._an = Analyzer()
        return self._an

    def corpus_tokens(self, texts):
        an = self._analyzer()
        return [an.analyze(t) for t in texts]

    def query_tokens(self, query):
        return self._analyzer().analyze(query)


class Pisa(Engine):
    name = "pisa"
    ALGORITHM = "block_max_wand"
    ENCODING = "block_simdbp"  # pyterrier-pisa's default

    def build(self, docs, out, corpus):
        # What PisaIndexer does, without pyterrier: documents as "docno text" lines; then the block-max data and
        # the compressed lists that the first retrieval context would otherwise build (part of the index).
        pisa = pisathon()
        out.mkdir(parents=True)
        lines = out / "docs.txt"
        with open(lines, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(f"{d.id} {_ONE_LINE.sub(' ', doc_text(d))}\n")
        pisa.index(str(lines), str(out), "porter2", 100_000, self.threads)
        lines.unlink()
        self._context(out)
        return {}

    def _context(self, out: Path):
        from indexer.analyzer import LUCENE_ENGLISH_STOPWORDS

        pisa = pisathon()
        stops = out / "stopwords.lucene.txt"
        stops.write_text("".join(f"{w}\n" for w in sorted(LUCENE_ENGLISH_STOPWORDS)))
        ctxt = pisa.RetrievalContext()
        pisa.prepare_index(ctxt, str(out), self.ENCODING, "bm25", "porter2", bm25_k1=K1, bm25_b=B,
                           stop_fname=str(stops))
        return ctxt

    def open(self, out):
        self._retrieve = pisathon().retrieve
        self._ctxt = self._context(out)
        self._buffers: dict[int, tuple] = {}

    def _run(self, queries: list[str], k: int, threads: int, algorithm: str | None = None):
        n = len(queries) * k
        bufs = self._buffers.get(n)
        if bufs is None:
            bufs = self._buffers[n] = (np.empty(n, np.int32), np.empty(n, object), np.empty(n, np.int32),
                                       np.empty(n, np.float32))
        size = self._retrieve(self._ctxt, algorithm or self.ALGORITHM, list(enumerate(queries)), k=k,
                              threads=threads, query_weighted=0, pretokenised=False, result_qidxs=bufs[0],
                              result_docnos=bufs[1], result_ranks=bufs[2], result_scores=bufs[3])
        return bufs[0][:size].copy(), bufs[1][:size].copy()

    def search(self, query, k):
        return self._run([query], k, 1)

    def batch(self, queries, k):
        qidx, docnos = self._run(queries, k, self.threads)
        return [(qidx[qidx == i], docnos[qidx == i]) for i in range(len(queries))]

    def ids(self, result):
        return [str(d) for d in result[1]]

    def variants(self):
        return super().variants() + [(f"pisa {alg}", _same, lambda q, k, alg=alg: self._run([q], k, 1, alg))
                                     for alg in ("maxscore", "block_max_maxscore")]


_ONE_LINE = re.compile(r"[\r\n]+")


_NON_WORD = re.compile(r"\W+")


class Tantivy(Engine):
    name = "tantivy"

    def _schema(self):
        import tantivy

        sb = tantivy.SchemaBuilder()
        sb.add_text_field("id", stored=True, tokenizer_name="raw")
        sb.add_text_field("body", stored=False, tokenizer_name="en_stem", index_option="freq")
        return sb.build()

    def build(self, docs, out, corpus):
        import tantivy

        out.mkdir(parents=True)
        index = tantivy.Index(self._schema(), path=str(out))
        writer = index.writer(heap_size=1_000_000_000, num_threads=self.threads)
        for d in docs:
            writer.add_document(tantivy.Document(id=d.id, body=doc_text(d)))
        writer.commit()
        writer.wait_merging_threads()
        return {}

    def open(self, out):
        import tantivy

        self.index = tantivy.Index.open(str(out))
        self.index.reload()
        self.searcher = self.index.searcher()

    def search(self, query, k):
        # Words only: the query language would read ':' '(' '-' etc. as operators.
        q, _ = self.index.parse_query_lenient(_NON_WORD.sub(" ", query).lower(), ["body"])
        return self.searcher.search(q, k, count=False).hits

    def batch(self, queries, k):
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.threads) as ex:
            return list(ex.map(lambda q: self.search(q, k), queries))

    def ids(self, result):
        return [self.searcher.doc(addr)["id"][0] for _, addr in result]


class RankBm25(Engine):
    name = "rank-bm25"
    threads = 1
    max_queries = 50  # a long query costs O(N * terms) in Python: time a sample only

    def build(self, docs, out, corpus):
        from rank_bm25 import BM25Okapi

        from indexer.analyzer import Analyzer

        an = Analyzer()
        ids, toks = [], []
        for d in docs:
            ids.append(d.id)
            toks.append(an.analyze(doc_text(d)))
        self.model = BM25Okapi(toks, k1=K1, b=B)
        self.doc_ids = np.asarray(ids, dtype=object)
        self.analyzer = an
        return {"note": "in memory"}

    def open(self, out):
        """The model lives in memory: the search phase runs in the build process."""

    def search(self, query, k):
        scores = self.model.get_scores(self.analyzer.analyze(query))
        top = np.argpartition(-scores, min(k, len(scores) - 1))[:k]
        return top[np.argsort(-scores[top], kind="stable")], scores

    def ids(self, result):
        top, scores = result
        return [self.doc_ids[i] for i in top if scores[i] > 0]


ENGINES: dict[str, type[Engine]] = {e.name: e for e in (Ragserve, Pyserini, Bm25s, Bm25sOurs, Pisa, Tantivy, RankBm25)}


def available(name: str) -> tuple[bool, str]:
    """Whether an engine's package is installed here (the optional peers may not be); a failure to run is
    reported by the engine's own subprocess."""
    import importlib.util

    peers_site()
    if name == "pisa":
        try:
            pisathon()
        except (ImportError, OSError) as e:
            return False, f"PISA's extension does not load ({e}); see tools/peers/install_peers.sh"
        return True, ""
    mod = {"tantivy": "tantivy", "rank-bm25": "rank_bm25", "bm25s": "bm25s",
           "bm25s-ours": "bm25s", "pyserini": "pyserini", "ragserve": "ragserve"}[name]
    if importlib.util.find_spec(mod) is None:
        return False, f"package {mod} is not installed"
    return True, ""


peers_site()


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) if Path(path).exists() else 0


def peak_rss_mib() -> tuple[float, float]:
    """(peak RSS of this process, of its largest finished child) in MiB (Linux reports KiB)."""
    import resource

    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))
