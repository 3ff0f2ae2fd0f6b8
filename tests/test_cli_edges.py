"""The rough edges a new user hit (issue #32, point 5): one default backend, help text on every option, eval's
usage, a short quote of a record in a format error, fpga not offered without pyxrt, and the README's first-run
timings as a range on a named machine."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ragserve.cli import build_parser
from ragserve.commands import BACKEND_HELP, DEFAULT_BACKEND
from tests.serverproc import run_cli

REPO = Path(__file__).resolve().parents[1]


def subparsers(parser: argparse.ArgumentParser, name: str = "ragserve"):
    """Every (command name, parser), sub-commands included."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, p in action.choices.items():
                yield from subparsers(p, f"{name} {sub}")


def test_one_backend_default_stated_once():
    parsers = dict(subparsers(build_parser()))
    backends = {name: next(a for a in p._actions if "--backend" in a.option_strings)
                for name, p in parsers.items() if any("--backend" in a.option_strings for a in p._actions)}
    assert set(backends) >= {"ragserve search", "ragserve eval", "ragserve serve"}
    assert {(a.default, a.help) for a in backends.values()} == {(DEFAULT_BACKEND, BACKEND_HELP)}
    assert DEFAULT_BACKEND == "auto"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    api = (REPO / "docs" / "API.md").read_text(encoding="utf-8")
    assert "`--backend auto` (the default)" in readme and "`--backend cpu` (default)" not in readme
    assert re.search(r"\| `--backend` \| `auto` \|", api)


def test_every_argument_has_help_text():
    missing = [f"{name} {a.option_strings[0] if a.option_strings else a.dest}"
               for name, p in subparsers(build_parser()) for a in p._actions
               if not isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction))
               and not a.help]  # a sub-command list shows each sub-command's own help
    assert missing == []
    search = run_cli("search", "--help").stdout
    assert re.search(r"--index DIR\s+index directory", search)
    assert re.search(r"DIR\s+index directory", run_cli("info", "--help").stdout)


def test_eval_usage_needs_no_action():
    out = run_cli("eval", "--help").stdout
    usage = out[:out.index("\n\n")]
    assert "ACTION" not in usage and usage.startswith("usage: ragserve eval --dataset FILE --method M")
    assert "ragserve eval build-index" in usage and "ragserve eval report ROWS.jsonl" in usage
    err = run_cli("eval", "report").stderr  # the sub-commands keep their own names in errors
    assert err.startswith("ragserve eval report: error: the following arguments are required") and \
        err.count("\n") == 1


def test_wrong_format_quotes_a_short_excerpt(tmp_path):
    rows = tmp_path / "passages.jsonl"
    rows.write_text('{"id": "0", "contents": "' + "word " * 500 + '"}\n', encoding="utf-8")
    r = run_cli("index", str(rows), "--format", "dpr-tsv", "--out", str(tmp_path / "ix"))
    assert r.returncode == 2
    line = r.stderr.strip().splitlines()[-1].split("\r")[-1]
    quoted = re.search(r"the first line is ('.*?')\.\.\.;", line)
    assert quoted and len(quoted.group(1)) <= 80, line
    assert len(line) - len(str(rows)) < 240 and "--format jsonl" in line
    assert not (tmp_path / "ix").exists()


def test_fpga_not_listed_available_without_pyxrt(monkeypatch):
    from ragserve.kernels.registry import get_backend_class
    from ragserve.server.warmup import backend_status

    monkeypatch.setitem(sys.modules, "pyxrt", None)  # import pyxrt -> ImportError, as without Xilinx XRT
    ok, why = get_backend_class("fpga").is_available()
    assert not ok and "pyxrt" in why and "Xilinx XRT" in why
    fpga = next(b for b in backend_status.__wrapped__() if b["name"] == "fpga")  # uncached: computed now
    assert fpga["available"] is False and "pyxrt" in fpga["reason"]
    cpu = next(b for b in backend_status.__wrapped__() if b["name"] == "cpu")
    assert cpu["available"] is True


def test_readme_first_run_timings_are_a_range_on_a_named_machine():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    para = readme[readme.index("The demo's first run"):].split("\n\n")[0]
    ready = re.search(r"ready (\d+)-(\d+) s after it starts listening", para)
    assert ready and int(ready.group(1)) < int(ready.group(2))
    assert "2-core" in para and "AMD EPYC" in para and "load average" in para
