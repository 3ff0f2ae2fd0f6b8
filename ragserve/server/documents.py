"""``POST /v1/documents`` and ``DELETE /v1/documents`` on a live index, and the thread that keeps it fresh.

A write is acknowledged (200) once its request is on disk in the write-ahead log; it is searchable after the
next refresh, at most ``refresh_interval_s`` later (or at once with ``"refresh": true``). The maintenance
thread refreshes, and runs the merge policy's merges in their own thread so a long merge never delays a
refresh; searches never wait for either. A server without ``--writes`` over a live index only follows the
commits that another writer (``ragserve add``) makes.
"""
from __future__ import annotations

import logging
import threading
import time

from indexer.segments import LiveIndex, LiveIndexError
from ragserve.server.errors import ApiError, invalid
from ragserve.server.validation import check_fields

MAX_DOCUMENTS = 10_000  # per request (the body limit applies too)
log = logging.getLogger("ragserve.server")


class LiveWrites:
    """The document endpoints' logic over one writable ``LiveIndex`` (None: writes are off)."""

    def __init__(self, live: LiveIndex | None, refresh_interval_s: float) -> None:
        self.live = live
        self.refresh_interval_s = refresh_interval_s

    def _writable(self) -> LiveIndex:
        if self.live is None or not self.live.writable:
            raise ApiError(403, "writes_disabled", "this server does not take writes: start it with --writes "
                                                   "(ragserve serve --index DIR --writes)")
        return self.live

    @staticmethod
    def _refresh_flag(data: dict) -> bool:
        r = data.get("refresh", False)
        if not isinstance(r, bool):
            raise invalid("refresh", "refresh must be true (searchable when the response comes) or false")
        return r

    def add(self, data: dict) -> dict:
        live = self._writable()
        check_fields(data, {"documents", "refresh"})
        docs = data.get("documents")
        if not isinstance(docs, list) or not docs:
            raise invalid("documents", "documents must be a non-empty array of {\"id\", \"title\", \"text\"}")
        if len(docs) > MAX_DOCUMENTS:
            raise invalid("documents", f"at most {MAX_DOCUMENTS} documents a request, got {len(docs)}")
        for i, d in enumerate(docs):
            where = f"documents[{i}]"
            if not isinstance(d, dict):
                raise invalid(where, f"{where} must be an object with id, title and text")
            check_fields(d, {"id", "title", "text"}, where + ".")
            if not isinstance(d.get("id"), str) or not d["id"]:
                raise invalid(where + ".id", f"{where}.id must be a non-empty string")
            if not isinstance(d.get("text"), str) or not isinstance(d.get("title", ""), str):
                raise invalid(where + ".text", f"{where}: text (and title, if given) must be strings")
        return self._write(live, [("add", {"id": d["id"], "title": d.get("title", ""), "text": d["text"]})
                                  for d in docs], self._refresh_flag(data))

    def delete(self, data: dict) -> dict:
        live = self._writable()
        check_fields(data, {"ids", "refresh"})
        ids = data.get("ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) and i for i in ids):
            raise invalid("ids", "ids must be a non-empty array of document ids (strings)")
        if len(ids) > MAX_DOCUMENTS:
            raise invalid("ids", f"at most {MAX_DOCUMENTS} ids a request, got {len(ids)}")
        return self._write(live, [("delete", i) for i in ids], self._refresh_flag(data))

    def _write(self, live: LiveIndex, ops: list, refresh: bool) -> dict:
        try:
            res = live.apply(ops)
        except LiveIndexError as e:
            raise invalid("documents", str(e)) from None
        except OSError as e:  # the log could not be written (indexer.wal.LogError, disk full, I/O)
            raise ApiError(503, "write_failed", f"{e}; the write was not acknowledged") from None
        if refresh:
            live.refresh()
        return {"acknowledged": True, "seq": res.seq, "added": res.added, "deleted": res.deleted,
                "missing": res.missing, "searchable": "now" if refresh else
                f"within {self.refresh_interval_s:g} s (the refresh interval)"}


class LiveMaintenance:
    """Refreshes a writable live index every ``interval_s`` (merging as its policy says, in another thread), or
    follows the commits of a read-only one."""

    def __init__(self, live: LiveIndex, interval_s: float) -> None:
        self.live = live
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._merging = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="live-refresh", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if not self.live.writable:
                    self.live.reload()
                    continue
                if self.live.pending:
                    self.live.refresh()
                if self.live.merge_candidates() is not None and self._merging.acquire(blocking=False):
                    threading.Thread(target=self._merge, name="live-merge", daemon=True).start()
            except Exception:  # logged, and tried again at the next tick: acknowledged writes are in the log
                log.exception("live index refresh failed")

    def _merge(self) -> None:
        try:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                run = self.live.merge_candidates()
                if run is None or not self.live.maybe_merge():
                    break
                log.info("merged %d segments in %.2f s; %d segments now", run[1] - run[0],
                         time.perf_counter() - t0, len(self.live.snapshot().segments))
        except Exception:
            log.exception("live index merge failed")
        finally:
            self._merging.release()

    def stop(self) -> None:
        """Stop refreshing and commit what is logged (a merge in flight is abandoned: its inputs stay, and the
        next open removes its unfinished output)."""
        self._stop.set()
        self._thread.join(timeout=5)
        if self.live.writable:
            try:
                self.live.refresh()
            except Exception:  # replayed from the log at the next open
                log.exception("live index refresh at shutdown failed")
