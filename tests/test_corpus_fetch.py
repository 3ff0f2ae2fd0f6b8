"""Corpus fetcher against a local HTTP server (Range support, truncation, 404): checksums, resume, unzip, CLI."""
from __future__ import annotations

import hashlib
import http.server
import io
import json
import re
import threading
import zipfile
from pathlib import Path

import pytest

from indexer.readers import FORMATS
from ragserve.cli import main
from ragserve.recipes import RecipeError, fetch, get_recipe, parse_recipe, recipes
from ragserve.fetch import FetchError, download

PAYLOAD = bytes(range(256)) * 4000  # 1,024,000 bytes, one read chunk is 1 MiB


class Server:
    """Serves ``files`` (name -> bytes) on 127.0.0.1 with optional Range support; records each request."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.ranges = True
        self.cut_after: int | None = None  # close the connection after this many body bytes
        self.requests: list[tuple[str, str | None]] = []
        self.sent = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                rng = self.headers.get("Range")
                server.requests.append((name, rng))
                if name not in server.files:
                    self.send_error(404, "Not Found")
                    return
                body = server.files[name]
                start = 0
                m = re.fullmatch(r"bytes=(\d+)-", rng or "")
                if m and server.ranges:
                    start = int(m.group(1))
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                chunk = body[start:] if server.cut_after is None else body[start:start + server.cut_after]
                # Counted before writing: the client may finish reading before this thread runs again.
                server.sent += len(chunk)
                self.wfile.write(chunk)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.timeout = 5
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"


@pytest.fixture
def server(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)  # 127.0.0.1 must be reached directly
    s = Server({"data.bin": PAYLOAD})
    s.thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()
    s.thread.join(timeout=5)


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_download_with_checksums(server, tmp_path):
    dest = tmp_path / "d" / "data.bin"
    download(server.url("data.bin"), dest, "sha256", sha256(PAYLOAD), timeout=10)
    assert dest.read_bytes() == PAYLOAD and not dest.with_name("data.bin.part").exists()
    md5 = hashlib.md5(PAYLOAD).hexdigest()
    download(server.url("data.bin"), tmp_path / "m.bin", "md5", md5.upper(), timeout=10)
    assert (tmp_path / "m.bin").read_bytes() == PAYLOAD


def test_checksum_mismatch_deletes_part(server, tmp_path):
    dest = tmp_path / "data.bin"
    with pytest.raises(FetchError, match=r"sha256 mismatch \(expected 0+, got [0-9a-f]{64}\); deleted data.bin.part"):
        download(server.url("data.bin"), dest, "sha256", "0" * 64, timeout=10)
    assert not dest.exists() and not list(tmp_path.iterdir())


def test_resume_sends_range_and_appends(server, tmp_path):
    dest = tmp_path / "data.bin"
    dest.with_name("data.bin.part").write_bytes(PAYLOAD[:300_000])
    download(server.url("data.bin"), dest, "sha256", sha256(PAYLOAD), timeout=10)
    assert dest.read_bytes() == PAYLOAD
    assert server.requests == [("data.bin", "bytes=300000-")] and server.sent == len(PAYLOAD) - 300_000


def test_interrupted_download_resumes_on_the_next_run(server, tmp_path):
    dest = tmp_path / "data.bin"
    server.cut_after = 400_000
    with pytest.raises(FetchError, match=r"closed after 400,000 of 1,024,000 bytes; run again to resume from data.bin.part"):
        download(server.url("data.bin"), dest, "sha256", sha256(PAYLOAD), timeout=10)
    assert dest.with_name("data.bin.part").stat().st_size == 400_000
    server.cut_after = None
    download(server.url("data.bin"), dest, "sha256", sha256(PAYLOAD), timeout=10)
    assert dest.read_bytes() == PAYLOAD and server.requests[-1] == ("data.bin", "bytes=400000-")


def test_server_without_range_support_restarts(server, tmp_path):
    server.ranges = False
    dest = tmp_path / "data.bin"
    dest.with_name("data.bin.part").write_bytes(b"garbage that must not stay in front")
    download(server.url("data.bin"), dest, "sha256", sha256(PAYLOAD), timeout=10)
    assert dest.read_bytes() == PAYLOAD


def test_complete_part_is_verified_after_416(server, tmp_path):
    dest = tmp_path / "data.bin"
    dest.with_name("data.bin.part").write_bytes(PAYLOAD)
    download(server.url("data.bin"), dest, "sha256", sha256(PAYLOAD), timeout=10)
    assert dest.read_bytes() == PAYLOAD and server.sent == 0


def test_http_404_and_refused_connection(server, tmp_path):
    with pytest.raises(FetchError, match=r"/missing.bin: HTTP 404 Not Found"):
        download(server.url("missing.bin"), tmp_path / "x", timeout=10)
    port = server.httpd.server_address[1]
    server.httpd.shutdown()
    server.httpd.server_close()
    with pytest.raises(FetchError, match=rf"http://127.0.0.1:{port}/data.bin: download failed"):
        download(f"http://127.0.0.1:{port}/data.bin", tmp_path / "y", timeout=5)


def zip_bytes(members: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
    return buf.getvalue()


def recipe_for(server: Server, name: str, data: bytes, unpack: str | None = None, md5: str | None = None) -> dict:
    return {"name": "local-test", "description": "served from 127.0.0.1", "format": "jsonl",
            "corpus": "set/corpus.jsonl", "queries": None, "qrels": None,
            "files": [{"url": server.url(name), "name": name, "md5": md5 or hashlib.md5(data).hexdigest(),
                       "sha256": None, "unpack": unpack}]}


def test_fetch_recipe_unzips_and_skips_verified_files(server, tmp_path):
    archive = zip_bytes({"set/corpus.jsonl": '{"_id": "1", "text": "x"}\n', "set/qrels/test.tsv": "query-id\tcorpus-id\tscore\n"})
    server.files["set.zip"] = archive
    recipe = parse_recipe(recipe_for(server, "set.zip", archive, "zip"), "test")
    fetch(recipe, tmp_path, timeout=10)
    assert (tmp_path / "set" / "corpus.jsonl").read_text().startswith('{"_id": "1"')
    assert (tmp_path / "set.zip").read_bytes() == archive
    n = len(server.requests)
    fetch(recipe, tmp_path, timeout=10)
    assert len(server.requests) == n  # present with the right md5: not downloaded again


def test_zip_member_outside_destination_is_refused(server, tmp_path):
    archive = zip_bytes({"../evil.txt": "x"})
    server.files["evil.zip"] = archive
    with pytest.raises(FetchError, match="would extract outside"):
        fetch(parse_recipe(recipe_for(server, "evil.zip", archive, "zip"), "test"), tmp_path / "d", timeout=10)
    assert not (tmp_path / "evil.txt").exists()


def test_cli_fetch_with_recipe_file(server, tmp_path, capsys):
    recipe = tmp_path / "local.json"
    recipe.write_text(json.dumps(recipe_for(server, "data.bin", PAYLOAD)))
    assert main(["corpus", "fetch", str(recipe), "--dest", str(tmp_path / "out"), "--timeout", "10"]) == 0
    assert (tmp_path / "out" / "data.bin").read_bytes() == PAYLOAD
    assert "corpus: " in capsys.readouterr().out
    recipe.write_text(json.dumps(recipe_for(server, "data.bin", PAYLOAD, md5="0" * 32)))
    assert main(["corpus", "fetch", str(recipe), "--dest", str(tmp_path / "bad"), "--timeout", "10"]) == 2
    err = capsys.readouterr().err
    assert "md5 mismatch" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    recipe.write_text(json.dumps(recipe_for(server, "gone.bin", PAYLOAD)))
    assert main(["corpus", "fetch", str(recipe), "--dest", str(tmp_path / "gone"), "--timeout", "10"]) == 2
    assert "gone.bin: HTTP 404" in capsys.readouterr().err


def test_cli_unknown_name_lists_known_corpora(capsys):
    assert main(["corpus", "fetch", "no-such-corpus"]) == 2
    err = capsys.readouterr().err
    assert "unknown corpus 'no-such-corpus'" in err and "beir-arguana" in err and "dpr-wiki" in err
    assert main(["corpus", "list"]) == 0
    out = capsys.readouterr().out
    assert "wikipedia-20231101-en" in out and "beir-scifact" in out


def test_bundled_recipes_are_well_formed():
    known = recipes()
    assert {"dpr-wiki", "wikipedia-20231101-en"} | {f"beir-{n}" for n in
            ("arguana", "scifact", "nfcorpus", "fiqa", "trec-covid", "hotpotqa", "nq", "msmarco")} <= set(known)
    for r in known.values():
        assert r.format in FORMATS and r.checksum_source
        for f in r.files:
            assert f.url.startswith("https://")
            algo, digest = f.checksum
            assert digest is None or re.fullmatch({"md5": "[0-9a-f]{32}", "sha256": "[0-9a-f]{64}"}[algo], digest)
    assert known["beir-arguana"].files[0].checksum == ("md5", "8ad3e3c2a5867cdced806d6503f29b99")
    assert known["dpr-wiki"].files[0].checksum == (None, None)
    assert len(known["wikipedia-20231101-en"].files) == 41
    with pytest.raises(RecipeError, match="unknown unpack"):
        parse_recipe({"name": "x", "description": "", "format": "jsonl",
                      "files": [{"url": "https://a/b", "name": "b", "unpack": "tar"}]}, "inline")
    with pytest.raises(RecipeError, match="no such recipe file"):
        get_recipe(str(Path("/nonexistent/r.json")))
