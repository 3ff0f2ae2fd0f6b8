"""The web page in headless Chromium (Debian's package, driven by playwright) against a real server."""
from __future__ import annotations

from pathlib import Path

import pytest
import requests

from tests import rag_support
from tests.serverproc import ServerProcess, start_model_server

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
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "install Debian's chromium (.ci/setup.sh does)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def open_page(browser, url: str):
    """A page of ``url`` and the problems seen while it is used: script errors, and failed GETs (the page's own
    files, its favicon, /v1/info; the tests' bad searches are POSTs)."""
    pg = browser.new_page()
    problems = []
    pg.on("pageerror", lambda e: problems.append(str(e)))
    pg.on("response", lambda r: problems.append(f"{r.status} {r.url}")
          if r.status >= 400 and r.request.method == "GET" else None)
    pg.goto(url + "/")
    return pg, problems


@pytest.fixture(scope="module")
def page(server, browser):
    pg, problems = open_page(browser, server.url)
    yield pg
    pg.close()
    assert not problems, problems


@pytest.fixture(scope="module")
def search_only(tmp_path_factory):
    """A server without a generator."""
    srv = ServerProcess("--index", str(rag_support.hotpot_index()), "--backend", "cpu")
    srv.wait_ready()
    yield srv
    assert srv.terminate() == 0, srv.log()


def test_page_shows_the_server(page, server):
    docs = requests.get(server.url + "/readyz", timeout=10).json()["index"]["documents"]
    assert docs >= 1000  # so the status line needs a thousands separator
    # The page arrives with its status line: no "connecting..." while the script asks /v1/info.
    served = requests.get(server.url + "/", timeout=10).text
    assert f"{docs:,} passages · backend cpu · model: " in served and "connecting" not in served
    page.wait_for_function("document.getElementById('method').options.length > 0")
    status = page.text_content("#status")
    assert f"{docs:,} passages" in status and "backend cpu" in status and "tiny-llama" in status
    methods = page.eval_on_selector_all("#method option", "os => os.map(o => o.value)")
    assert methods == requests.get(server.url + "/v1/info", timeout=10).json()["methods"]
    assert page.input_value("#method") == "single" and page.is_visible("#method")
    assert not page.is_visible("#ask-note")


def test_favicon_is_served(server):
    r = requests.get(server.url + "/favicon.ico", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("image/svg+xml") and b"<svg" in r.content


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


def test_k_field_has_the_servers_maximum(page, server):
    max_k = requests.get(server.url + "/v1/info", timeout=10).json()["limits"]["max_k"]
    for field in ("#search-k", "#ask-k"):
        assert page.get_attribute(field, "max") == str(max_k)
    page.fill("#search-k", str(max_k + 1))
    assert page.eval_on_selector("#search-k", "e => e.validity.rangeOverflow")  # the browser will not send it
    page.fill("#search-k", "10")


def test_search_error_replaces_the_previous_result(page):
    page.fill("#search-query", "Scott Derrickson director")
    page.fill("#search-k", "3")
    page.click("#search-button")
    page.wait_for_selector("#search-results li:nth-child(3)")
    page.fill("#search-query", "x" * 2001)  # over the server's --max-query-chars
    page.click("#search-button")
    page.wait_for_selector("#search-error:not([hidden])")
    assert "too long" in page.text_content("#search-error")
    assert page.text_content("#search-meta") == "" and page.query_selector_all("#search-results li") == []


def test_search_without_hits_says_so_and_suggests(page):
    page.fill("#search-query", "zzqxv qqzzxv")
    page.click("#search-button")
    page.wait_for_function("document.getElementById('search-meta').textContent !== ''")
    meta = page.text_content("#search-meta")
    assert meta.startswith("No passage matches “zzqxv qqzzxv”") and "Try other words, e.g. " in meta
    assert page.query_selector_all("#search-results li") == [] and not page.is_visible("#search-error")


def test_page_without_a_generator_hides_the_method_list(search_only, browser):
    pg, problems = open_page(browser, search_only.url)
    try:
        pg.wait_for_selector("#ask-note:not([hidden])")
        assert "No generator is loaded" in pg.text_content("#ask-note")
        assert not pg.is_visible("#method") and pg.is_disabled("#ask-button")
        assert not pg.is_visible("#ask-error")  # a note, not an error
        assert "model: no generator loaded" in pg.text_content("#status")
    finally:
        pg.close()
    assert not problems, problems


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
