"""Bearer-token auth of a real ``ragserve serve`` process, and the CLI's refusals."""
from __future__ import annotations

import pytest
import requests

from ragserve.cli import main
from tests.serverproc import ServerProcess, run_cli

KEY = "test-key-7f3a"
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(arguana_index):
    # The key comes from the environment here; --api-key overrides it (checked below).
    srv = ServerProcess("--index", str(arguana_index), "--backend", "cpu", env={"RAGSERVE_API_KEY": KEY})
    yield srv
    assert srv.terminate() == 0, srv.log()


def auth(key=KEY):
    return {"Authorization": f"Bearer {key}"}


def test_open_endpoints(server):
    assert requests.get(server.url + "/healthz", timeout=10).status_code == 200
    page = requests.get(server.url + "/", timeout=10)
    assert page.status_code == 200 and 'id="api-key"' in page.text  # the page asks for the key itself
    assert requests.get(server.url + "/static/app.js", timeout=10).status_code == 200


@pytest.mark.parametrize("method,path", [("GET", "/readyz"), ("GET", "/v1/info"), ("GET", "/metrics"),
                                         ("POST", "/v1/search"), ("POST", "/v1/answer")])
@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {KEY}", KEY, "Bearer "])
def test_protected_endpoints_need_the_key(server, method, path, header):
    headers = {**JSON, **({"Authorization": header} if header is not None else {})}
    r = requests.request(method, server.url + path, headers=headers, data=b'{"query": "tax"}', timeout=10)
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert r.json()["error"]["field"] == "Authorization"


def test_right_key_is_accepted(server):
    r = requests.post(server.url + "/v1/search", json={"query": "tax on sugar", "k": 3}, headers=auth(), timeout=10)
    assert r.status_code == 200 and len(r.json()["hits"]) == 3
    info = requests.get(server.url + "/v1/info", headers=auth(), timeout=10).json()
    assert info["auth"] is True and KEY not in str(info)
    metrics = requests.get(server.url + "/metrics", headers=auth(), timeout=10).text
    assert 'endpoint="/v1/search",method="POST",status="401"' in metrics


def test_flag_overrides_environment(arguana_index):
    srv = ServerProcess("--index", str(arguana_index), "--backend", "cpu", "--api-key", "flag-key",
                        env={"RAGSERVE_API_KEY": KEY})
    try:
        body = {"query": "tax"}
        assert requests.post(srv.url + "/v1/search", json=body, headers=auth(), timeout=10).status_code == 401
        assert requests.post(srv.url + "/v1/search", json=body, headers=auth("flag-key"), timeout=10).status_code == 200
    finally:
        assert srv.terminate() == 0


def test_non_loopback_bind_without_key_is_refused(arguana_index):
    r = run_cli("serve", "--index", str(arguana_index), "--host", "0.0.0.0", "--port", "0",
                env={"RAGSERVE_API_KEY": ""})
    assert r.returncode == 2
    assert "non-loopback" in r.stderr and "--api-key" in r.stderr
    assert "listening" not in r.stderr


# The same checks in-process (each fails before anything is bound, so a subprocess apiece would only add time).
@pytest.mark.parametrize("args,message", [
    (["--host", "::"], "non-loopback"),
    (["--host", "192.0.2.10"], "non-loopback"),
    (["--index", "/nonexistent/index"], "no such index directory"),
    (["--max-k", "0"], "--max-k"),
    (["--threads", "4", "--max-pending-answers", "4"], "--threads"),
    (["--request-timeout", "0"], "request_timeout_s"),
    (["--port", "70000"], "--port"),
    (["--api-key", " "], "api_key"),
])
def test_cli_rejects_bad_flags(arguana_index, args, message, monkeypatch, capsys):
    monkeypatch.delenv("RAGSERVE_API_KEY", raising=False)
    base = [] if "--index" in args else ["--index", str(arguana_index)]
    assert main(["serve", *base, *args]) == 2
    assert message in capsys.readouterr().err
