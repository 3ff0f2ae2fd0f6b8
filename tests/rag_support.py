"""Artefacts shared by the tests/test_rag_*.py modules, built once per test process: a tiny random Llama
with a BPE tokenizer trained on HotpotQA text, a tiny cross-encoder, and a BM25 index of the HotpotQA dev
paragraphs (the closed corpus the e2e runs retrieve from)."""
from __future__ import annotations

import atexit
import contextlib
import functools
import shutil
import tempfile
from pathlib import Path

from tests.conftest import shared

HOTPOT_IRCOT = ("hotpotqa-dev500-ircot", "dev_subsampled.jsonl")


@functools.cache
def workdir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="ragserve-rag-tests-"))
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    return d


@functools.cache
def hotpot_examples() -> list:
    from ragserve.rag.datasets import read_dataset
    return read_dataset(shared(*HOTPOT_IRCOT), "hotpotqa-ircot")


def _texts() -> list[str]:
    from ragserve.rag.prompts import PROMPTS_DIR
    ex = hotpot_examples()[:150]
    texts = [e.question for e in ex] + [f"{p.title} {p.text}" for e in ex for p in e.paragraphs]
    # the chain-of-thought exemplar files only, in a fixed list: the tiny tokenizer (and so the random model's text,
    # which some loop tests depend on) must not change when another prompt file is added
    return texts + [(PROMPTS_DIR / name).read_text() for name in ("multihop.txt", "nq.txt", "strategyqa.txt")]


@functools.cache
def tiny_lm() -> Path:
    from tools.tiny_models import build_tiny_lm
    return build_tiny_lm(workdir() / "tiny-llama", _texts())


@functools.cache
def tiny_cross_encoder() -> Path:
    from tools.tiny_models import build_tiny_cross_encoder
    return build_tiny_cross_encoder(workdir() / "tiny-ce", _texts()[:400])


@functools.cache
def hotpot_index() -> Path:
    from ragserve.rag.corpus import build_dataset_index
    out = workdir() / "hotpot-index"
    build_dataset_index(hotpot_examples(), out, workers=1)
    return out


@functools.cache
def generator():
    from ragserve.rag.generator import Generator
    return Generator(str(tiny_lm()), device="cpu")


@contextlib.contextmanager
def one_torch_thread():
    """Tiny models run fastest on one thread; two spinning threads on a shared 2-core box are far slower."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
