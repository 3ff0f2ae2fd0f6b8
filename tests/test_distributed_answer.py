"""``/v1/answer`` on Ray Serve: the generator in its own deployment, called by the ingress's RAG methods,
answers as the library's method does in-process (the tiny random Llama of tests/rag_support.py; greedy, so
repeatable). Its own module: Ray Serve runs one application set per cluster, so this server starts after the
search server of test_distributed.py has stopped."""
from __future__ import annotations

import pytest
import requests

from ragserve.rag.methods import build_method
from ragserve.rag.prompts import PromptBuilder, load_exemplars
from ragserve.retrieval.searcher import Searcher
from tests import rag_support
from tests.serverproc import ServerProcess

pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one worker, one Ray cluster

QUESTION = "Were Scott Derrickson and Ed Wood of the same nationality?"
SMALL = {"k": 2, "max_new_tokens": 8, "answer_max_tokens": 4}


@pytest.fixture(scope="module")
def exemplars(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "one.txt"
    path.write_text("Question: Who wrote Pride and Prejudice?\nAnswer: It was written by Jane Austen. "
                    "So the answer is Jane Austen.\n")
    return path


@pytest.fixture(scope="module")
def model_server(ray_cluster, exemplars):
    srv = ServerProcess("--index", str(rag_support.hotpot_index()), "--backend", "cpu", "--ray", ray_cluster,
                        "--ray-groups", "1", "--ray-group-cpus", "0.5", "--model", str(rag_support.tiny_lm()),
                        "--device", "cpu", "--max-new-tokens", "48", "--exemplars", str(exemplars),
                        startup_timeout=600)
    srv.wait_ready(timeout=600)
    yield srv
    assert srv.terminate(timeout=120) == 0, srv.log()


@pytest.mark.parametrize("method", ["flare", "dragin"])
def test_answer_on_ray_serve_equals_the_in_process_method(model_server, exemplars, method):
    searcher = Searcher(rag_support.hotpot_index(), backend="cpu")
    try:
        with rag_support.one_torch_thread():
            answer, trace = build_method(method, rag_support.generator(), PromptBuilder(load_exemplars(exemplars)),
                                         searcher, **SMALL).answer(QUESTION)
    finally:
        searcher.close()
    r = requests.post(model_server.url + "/v1/answer", json={"question": QUESTION, "method": method,
                                                             "options": SMALL}, timeout=300)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == answer and body["output"] == trace.output
    strip = [{k: v for k, v in s.to_dict().items() if k != "times"} for s in trace.steps]
    assert [{k: v for k, v in s.items() if k != "times"} for s in body["trace"]] == strip
    info = requests.get(model_server.url + "/v1/info", timeout=10).json()
    assert info["model"]["device"] == "cpu" and info["model"]["dtype"] == "float32"
