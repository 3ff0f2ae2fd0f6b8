"""Sparse attention through ``ragserve serve --attention``: the server's default, a request's own choice within
the server's limits, and bad settings refused (a 400 naming the field, or exit 2 at start)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from ragserve.rag.methods import build_method
from ragserve.rag.prompts import PromptBuilder, load_exemplars
from ragserve.retrieval.searcher import Searcher
from tests import rag_support
from tests.conftest import REPO
from tests.serverproc import start_model_server

QUESTION = "Were Scott Derrickson and Ed Wood of the same nationality?"
OPTIONS = {"k": 3, "max_new_tokens": 12, "answer_max_tokens": 4}


@pytest.fixture(scope="module")
def server(exemplars):
    srv = start_model_server("--max-new-tokens", "48", "--exemplars", str(exemplars), "--attention", "quest",
                             "--attention-budget", "8192", "--attention-max-budget", "8192")
    yield srv
    srv.terminate()


def ask(server, **body):
    return requests.post(server.url + "/v1/answer", json=body, timeout=120)


def in_process(exemplars, attention=None) -> str:
    searcher = Searcher(rag_support.hotpot_index(), backend="cpu")
    try:
        gen = rag_support.generator()
        method = build_method("single", gen, PromptBuilder(load_exemplars(exemplars)), searcher, **OPTIONS)
        with gen.attention_scope(attention):
            return method.answer(QUESTION)[0]
    finally:
        searcher.close()


def test_default_sparse_decoding_with_room_for_everything_answers_as_dense(server, exemplars):
    body = ask(server, question=QUESTION, method="single", options=OPTIONS).json()
    assert body["answer"] == in_process(exemplars) and "attention" not in body


def test_a_request_sets_its_own_method_and_budget(server, exemplars):
    att = {"method": "lserve", "budget": 128}
    body = ask(server, question=QUESTION, method="single", options=OPTIONS, attention=att).json()
    assert body["attention"] == att
    lserve = rag_support.generator().sparse_method("lserve", 128)
    assert body["answer"] == in_process(exemplars, lserve)


@pytest.mark.parametrize("attention,field", [
    ({"method": "sparse"}, "attention.method"),
    ({"method": "quest", "budget": 8193}, "attention.budget"),  # over --attention-max-budget
    ({"method": "quest", "budget": "64"}, "attention.budget"),
    ({"method": "quest", "pages": 4}, "attention.pages"),
    ({"method": "seer-topk", "budget": 64}, "attention"),  # below the sink + local window + one block
    ("quest", "attention"),
])
def test_bad_attention_is_a_400(server, attention, field):
    r = ask(server, question=QUESTION, method="single", options=OPTIONS, attention=attention)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == field


@pytest.mark.parametrize("args,message", [
    (["--attention", "nope"], "unknown attention method 'nope'"),
    (["--attention-budget", "64"], "--attention-budget needs --attention"),
    (["--attention", "seer-topk", "--attention-budget", "64"], "budget 64 is below 192 tokens"),
])
def test_bad_attention_flags_exit_2_before_loading_anything(args, message):
    r = subprocess.run([sys.executable, "-m", "ragserve", "serve", "--index", str(rag_support.hotpot_index()),
                        "--model", "x", *args], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
