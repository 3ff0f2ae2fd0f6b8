"""The web page in headless Chromium (Debian's package, driven by playwright) against a real server."""
from __future__ import annotations

from pathlib import Path

import pytest
import requests

from tests.serverproc import start_model_server

CHROMIUM = "/usr/bin/chromium"  # .ci/setup.sh installs it; playwright never downloads a browser here
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
QUESTION = "Were Scott Derrickson and Ed Wood of the same nationality?"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    one = tmp_path_factory.mktemp("prompts") / "one.txt"
    one.write_text("Question: Who wrote Pride and Prejudice?\nAnswer: It was written by Jane Austen. "
                   "So the answer is Jane Austen.\n")
    srv = start_model_server("--exemplars", str(one))
    yield srv
    assert srv.terminate() == 0, srv.log()


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "install Debian's chromium (.ci/setup.sh does)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        pg = browser.new_page()
        errors = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(server.url + "/")
        yield pg
        browser.close()
    assert not errors, errors


def test_page_shows_the_server(page, server):
    page.wait_for_function("document.getElementById('status').textContent.includes('passages')")
    docs = requests.get(server.url + "/readyz", timeout=10).json()["index"]["documents"]
    status = page.text_content("#status")
    assert f"{docs} passages" in status and "backend cpu" in status and "tiny-llama" in status
    methods = page.eval_on_selector_all("#method option", "os => os.map(o => o.value)")
    assert methods == requests.get(server.url + "/v1/info", timeout=10).json()["methods"]
    assert page.input_value("#method") == "single"


def test_search_box_renders_hits(page, server):
    page.fill("#search-query", "Scott Derrickson director")
    page.fill("#search-k", "5")
    page.click("#search-button")
    page.wait_for_selector("#search-results li:nth-child(5)")
    api = requests.post(server.url + "/v1/search", json={"query": "Scott Derrickson director", "k": 5},
                        timeout=10).json()["hits"]
    items = page.query_selector_all("#search-results li")
    assert len(items) == 5
    for item, hit in zip(items, api):
        head = item.query_selector(".hit-head").text_content()
        assert hit["id"] in head and (hit["title"] or hit["id"]) in head
        assert item.query_selector(".hit-text").text_content()[:100] == hit["text"][:100]
    assert "5 hits" in page.text_content("#search-meta")


def test_search_error_is_shown(page):
    page.fill("#search-query", "anything")
    page.fill("#search-k", "500")  # over the server's --max-k (the browser itself stops k < 1)
    page.click("#search-button")
    page.wait_for_selector("#search-error:not([hidden])")
    assert "k must be between" in page.text_content("#search-error")


def test_ask_shows_answer_steps_and_passages(page, server, tmp_path):
    page.fill("#question", QUESTION)
    page.select_option("#method", "single")
    page.fill("#ask-k", "2")
    page.click("#ask-button")
    page.wait_for_function("document.getElementById('answer').textContent !== '…' && "
                           "document.querySelectorAll('#passages li').length > 0", timeout=120_000)
    api = requests.post(server.url + "/v1/answer", json={"question": QUESTION, "method": "single",
                                                         "options": {"k": 2}}, timeout=120).json()
    assert page.text_content("#answer") == api["answer"]
    steps = page.query_selector_all("#steps li")
    assert [s.query_selector(".step-kind").text_content() for s in steps] == [s["kind"] for s in api["trace"]]
    assert "query: " + QUESTION in steps[0].text_content()
    passages = page.query_selector_all("#passages li .hit-head")
    assert [p.text_content() for p in passages] and all(
        h["id"] in p.text_content() for p, h in zip(passages, api["passages"]))
    assert len(passages) == len(api["passages"]) == 2
    page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
