"""Shard groups on Ray actors, fanned out and merged at the head: the exact global top-k.

The layout is document-partitioned and every shard is scored with the index's global statistics (df, doc count,
avgdl), so a document's score does not depend on which shards are searched with it. Let T be the global top-k
under the order of ``indexer/FORMAT.md`` (score descending, then docid ascending: a total order). A document d of
T lies in exactly one group; every document of that group ranked above d is ranked above d globally too, so fewer
than k precede it in its group and d is in the group's exact local top-k. The union of the local lists thus
holds T, and sorting it by the same order and keeping k gives T: ids, ranks and score bits.

Each group is a Ray actor (``ShardGroup``) that loads its shards from the index files, checks them against the
manifest's SHA-256, and runs its own backend (cpu; gpu with ``num_gpus``; fpga with a custom resource). Ray
restarts a dead actor (the constructor runs again: files reloaded and checked). Until it is back, a search
either fails with ``ShardsUnavailable`` naming the missing shards or, when the caller asks for partial results,
returns the exact top-k of the shards that answered and names those that did not. Never a silently wrong list.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from indexer import layout as L
from indexer.bm25 import QueryTerms
from indexer.files import sha256_file
from indexer.reader import IndexReader, InvalidIndexError
from ragserve.distributed import connect
from ragserve.distributed.errors import RayUnavailable
from ragserve.kernels.contract import MAX_K, ShardsUnavailable, StageTimes, TopK
from ragserve.kernels.registry import get_backend_class
from ragserve.retrieval.contract import Hit, Retriever, bm25_params
from ragserve.retrieval.searcher import Searcher

NAMESPACE = "ragserve"  # Ray namespace of named (serving) shard-group actors
DEVICE_BACKENDS = {"gpu", "fpga"}  # one device context a replica: its calls are taken one at a time


class ShardFilesError(InvalidIndexError):
    """A replica's shard files do not match the manifest's sizes or SHA-256."""


# -- the merge --------------------------------------------------------------------------------------------
def merge_topk(lists: list[TopK], k: int) -> TopK:
    """The first ``k`` of the union of exact local top-k lists of disjoint shards, by score descending then
    docid ascending (FORMAT.md's tie rule): the exact top-k of those shards (see the module docstring)."""
    lists = [t for t in lists if t.docids.size]
    if not lists:
        return TopK(np.zeros(0, np.int64), np.zeros(0, np.float32))
    docids = np.concatenate([t.docids for t in lists]).astype(np.int64, copy=False)
    scores = np.concatenate([t.scores for t in lists]).astype(np.float32, copy=False)
    order = np.lexsort((docids, -scores))[:k]  # the last key is the primary one; -x of an f32 is exact
    return TopK(docids[order], scores[order])


# -- the plan ---------------------------------------------------------------------------------------------
def plan_groups(manifest: dict, groups: int) -> list[list[int]]:
    """Consecutive shards in ``groups`` groups of about the same bytes (at least one shard each)."""
    sizes = [int(s["bytes"]) for s in manifest["shards"]]
    n = len(sizes)
    if not 1 <= groups <= n:
        raise ValueError(f"shard groups must be between 1 and the index's {n} shards, got {groups}")
    total = sum(sizes)
    out: list[list[int]] = []
    cur: list[int] = []
    acc = 0
    for i, size in enumerate(sizes):
        cur.append(i)
        acc += size
        left_groups = groups - len(out) - 1
        if left_groups and (acc >= total * (len(out) + 1) / groups or n - i - 1 == left_groups):
            out.append(cur)
            cur = []
    out.append(cur)
    return out


def group_files(manifest: dict, shards: list[int]) -> list[str]:
    """The files a replica of these shards reads: the shards' arrays and the norms."""
    dirs = tuple(manifest["shards"][s]["dir"] + "/" for s in shards)
    return [name for name in manifest["files"] if name.startswith(dirs) or name == L.NORMS]


def verify_files(path: Path, manifest: dict, names: list[str]) -> None:
    """Size and SHA-256 of each named file against the manifest; ``ShardFilesError`` names the first mismatch."""
    for name in names:
        meta = manifest["files"][name]
        f = path / name
        if not f.is_file() or f.stat().st_size != meta["bytes"]:
            raise ShardFilesError(f"{path}: {name} is missing or truncated")
        if sha256_file(f) != meta["sha256"]:
            raise ShardFilesError(f"{path}: {name} does not match the manifest's SHA-256; the index is corrupt")


# -- one group --------------------------------------------------------------------------------------------
class ShardGroup:
    """Some shards of an index and a backend over them alone (the body of a Ray actor; also usable in-process)."""

    def __init__(self, index: str | Path, shards: list[int], backend: str = "cpu",
                 options: dict | None = None, verify: bool = True) -> None:
        reader = IndexReader(index)
        if verify:
            verify_files(reader.path, reader.manifest, group_files(reader.manifest, shards))
        # Backends search every shard of ``index.shards`` with the index's global statistics: keep ours.
        reader.shards = [reader.shards[s] for s in shards]
        self.shards = list(shards)
        self.backend_name = backend
        self.backend = get_backend_class(backend)(reader, **(options or {}))
        # One search before the replica counts as up: kernels compile (or load from numba's cache) now, not
        # within the first request's deadline.
        probe = QueryTerms(np.zeros(1, np.uint32), np.ones(1, np.float32), np.ones(1, np.float32))
        self.backend.search_terms([probe], 1, reader.k1, reader.b)
        self.backend.search_terms([probe, probe], 1, reader.k1, reader.b)  # a batch takes the multi-query path
        self.loaded_at = time.time()

    def search(self, queries: list[QueryTerms], k: int, k1: float, b: float) -> tuple[list[TopK], StageTimes]:
        """Exact local top-k of each analysed query over this group's shards."""
        times = StageTimes()
        return self.backend.search_terms(queries, k, k1, b, times), times

    def info(self) -> dict:
        return {"shards": self.shards, "pid": os.getpid(), "loaded_at": self.loaded_at, **self.backend.describe()}

    def close(self) -> None:
        self.backend.close()


@dataclass
class GroupOptions:
    """Where and how each shard-group replica runs."""

    backend: str = "cpu"
    backend_options: dict = field(default_factory=dict)
    num_cpus: float = 1.0  # CPUs Ray reserves for a replica (cpu backend: also its search threads)
    num_gpus: float = 0.0  # e.g. 0.25: four replicas share one GPU
    resources: dict = field(default_factory=dict)  # e.g. {"fpga": 1}: a custom resource the FPGA nodes declare
    concurrency: int = 0  # calls a replica takes at once (0: its CPUs for cpu, 1 for device backends)
    verify: bool = True  # SHA-256 of the files at every (re)start

    def actor_options(self) -> dict:
        conc = self.concurrency or (1 if self.backend in DEVICE_BACKENDS else max(1, int(self.num_cpus)))
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "resources": self.resources,
                "max_concurrency": conc, "max_restarts": -1, "max_task_retries": 0}

    def fit(self, resources: dict) -> int:
        """How many replicas the cluster's ``resources`` hold (at least 1)."""
        need = {r: v for r, v in {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}.items() if v > 0}
        if not need:
            return 1
        return max(1, min(int(resources.get(r, 0) // v) for r, v in need.items()))

    def replica_backend_options(self) -> dict:
        if self.backend == "cpu" and "threads" not in self.backend_options:
            return {**self.backend_options, "threads": max(1, int(self.num_cpus))}
        return dict(self.backend_options)


# -- the head ---------------------------------------------------------------------------------------------
class ShardFanout:
    """The head's side of the groups: one call to every group actor, the merge, the missing shards."""

    def __init__(self, ray_module, actors: list, plan: list[list[int]], options: GroupOptions,
                 timeout_s: float) -> None:
        self.ray = ray_module
        self.actors = actors
        self.plan = plan
        self.options = options
        self.timeout_s = timeout_s

    def describe(self) -> dict:
        return {"backend": self.options.backend, "ray": {"groups": self.plan, "num_cpus": self.options.num_cpus,
                                                        "num_gpus": self.options.num_gpus,
                                                        "timeout_s": self.timeout_s}}

    def search_terms(self, queries: list[QueryTerms], k: int, k1: float, b: float, times: StageTimes | None = None,
                     missing: set[int] | None = None) -> list[TopK]:
        """The exact top-k of each query over the shards that answered; with ``missing`` None every group must
        answer (else ``ShardsUnavailable``), otherwise the missing shards are added to it."""
        ray = self.ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        t0 = time.perf_counter()
        payload = ray.put(queries) if len(self.actors) > 1 else queries  # serialised once for all groups
        args = (payload, k, k1, b)
        refs = [a.search.remote(*args) for a in self.actors]
        deadline = time.monotonic() + self.timeout_s
        answers: list[list[TopK]] = []
        lost: dict[int, str] = {}
        relevancy = 0.0
        for g, ref in enumerate(refs):
            try:
                tops, t = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except (RayActorError, ActorUnavailableError) as e:
                lost[g] = f"replica of group {g} is down: {type(e).__name__}"
                continue
            except GetTimeoutError:
                answer = self._retry(g, ref, args)
                if isinstance(answer, str):
                    lost[g] = answer
                    continue
                tops, t = answer
            answers.append(tops)
            relevancy = max(relevancy, t.relevancy)
        if lost:
            shards = [s for g in lost for s in self.plan[g]]
            if missing is None:
                raise ShardsUnavailable(shards, "; ".join(lost.values()))
            missing.update(shards)
        merged = [merge_topk([a[i] for a in answers], k) for i in range(len(queries))]
        if times is not None:  # relevancy: the slowest group's scoring; the rest of the round trip is retrieval
            times.relevancy += relevancy
            times.retrieval += (time.perf_counter() - t0) - relevancy
        return merged

    def _retry(self, g: int, ref, args: tuple) -> tuple[list[TopK], StageTimes] | str:
        """A group that missed the deadline gets one more: its call is sent again, and whichever of the two
        answers first within another ``timeout_s`` counts (a slow start, a busy machine); otherwise why not."""
        ray = self.ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        pending = [ref, self.actors[g].search.remote(*args)]
        ready, rest = ray.wait(pending, num_returns=1, timeout=self.timeout_s)
        for r in rest:
            ray.cancel(r)
        if not ready:
            return f"group {g} did not answer within {self.timeout_s:g} s, nor a retry within {self.timeout_s:g} s more"
        try:
            return ray.get(ready[0])
        except (RayActorError, ActorUnavailableError) as e:
            return f"replica of group {g} is down: {type(e).__name__}"

    def pids(self) -> list[int]:
        """Process id of each group's replica (for tests and tools that stop one)."""
        return [self.ray.get(a.info.remote())["pid"] for a in self.actors]


def _actor_class(ray_module):
    return ray_module.remote(ShardGroup)


class DistributedSearcher(Retriever):
    """A BM25 retriever over shard groups held by Ray actors: the same hits, ids, ranks
    and score bits as a local ``Searcher`` of the same index (the merge is exact).

    ``ray``: the cluster's address, or ``local`` to start one here. ``groups``: the number of shard groups
    (default: as many replicas as the cluster holds, at most one per shard) or an explicit plan (lists of shard
    numbers). ``name``: named, detached actors
    that other processes (the Ray Serve ingress replicas) attach to; ``shutdown`` stops them.

    Ready means warm: each replica has run a search before the constructor returns (``ShardGroup``), so no
    compile or load falls within a request's deadline. ``timeout_s``: the seconds a group has to answer a
    batch; a group that misses it is asked again and given as long once more (``ShardFanout._retry``) before its
    shards count as unavailable: a busy machine or a slow start is not a dead replica.
    """

    kind = "bm25"
    exact = True
    takes_bm25_params = True
    can_miss_shards = True  # search_batch takes ``missing`` (partial results)

    def __init__(self, index: str | Path, ray: str = "local", groups: int | list[list[int]] | None = None,
                 options: GroupOptions | None = None, name: str | None = None, timeout_s: float = 30.0,
                 start_timeout_s: float = 300.0) -> None:
        ray_module = connect(ray)
        self.options = options or GroupOptions()
        # The head analyses queries and fetches passages; scoring happens in the groups. Its cpu backend is
        # never searched (it only maps the files).
        self._head = Searcher(index, backend="cpu", threads=1)
        self.index = self._head.index
        self.analyzer = self._head.analyzer
        n = len(self.index.shards)
        if isinstance(groups, list):
            plan = [list(g) for g in groups]
        else:
            plan = plan_groups(self.manifest, groups or min(n, self.options.fit(ray_module.cluster_resources())))
        if sorted(s for g in plan for s in g) != list(range(n)):
            raise ValueError(f"the shard groups {plan} must cover shards 0..{n - 1} once each")
        self.name = name
        cls = _actor_class(ray_module)
        path = str(self.index.path.resolve())
        actors = []
        for g, shards in enumerate(plan):
            opts: dict[str, Any] = self.options.actor_options()
            if name is not None:
                opts.update(name=f"{name}/group-{g}", namespace=NAMESPACE, lifetime="detached", get_if_exists=True)
            actors.append(cls.options(**opts).remote(path, shards, self.options.backend,
                                                     self.options.replica_backend_options(), self.options.verify))
        self.backend = ShardFanout(ray_module, actors, plan, self.options, timeout_s)
        self.backend_name = self.options.backend
        from ray.exceptions import GetTimeoutError

        try:  # loaded and checked, or the error now
            ray_module.get([a.info.remote() for a in actors], timeout=start_timeout_s)
        except GetTimeoutError:
            self.shutdown()
            o = self.options
            raise RayUnavailable(f"{len(plan)} shard-group replicas were not up within {start_timeout_s:g} s: "
                                 f"each needs {o.num_cpus:g} CPU, {o.num_gpus:g} GPU"
                                 + (f", {o.resources}" if o.resources else "") + "; the cluster has "
                                 f"{ray_module.cluster_resources()}") from None
        except Exception as e:
            self.shutdown()
            cause = getattr(e, "cause", None)
            raise (cause if isinstance(cause, Exception) else e) from None

    @property
    def manifest(self) -> dict:
        return self.index.manifest

    @property
    def plan(self) -> list[list[int]]:
        return self.backend.plan

    def analyze(self, query: str) -> QueryTerms:
        return self._head.analyze(query)

    @property
    def max_k(self) -> int:
        return min(MAX_K, get_backend_class(self.options.backend).max_k)

    def _search_batch(self, queries: list[str], k: int, k1: float | None, b: float | None, with_text: bool,
                      times: StageTimes | None, missing: set[int] | None = None) -> list[list[Hit]]:
        """``missing``: accept partial results, adding the shards that did not answer to this set (without it,
        ``ShardsUnavailable`` is raised when any did not)."""
        k1, b = bm25_params(self.index, k1, b)
        t0 = time.perf_counter()
        analysed = [self.analyze(q) for q in queries]
        t1 = time.perf_counter()
        kt = StageTimes()
        tops = self.backend.search_terms(analysed, k, k1, b, kt, missing)
        t2 = time.perf_counter()
        hits = [self.hits(t, with_text) for t in tops]
        if times is not None:
            times.add(StageTimes(prepare=t1 - t0, relevancy=kt.relevancy,
                                 retrieval=kt.retrieval + (time.perf_counter() - t2)))
        return hits

    def close(self) -> None:
        """Stop the actors this searcher owns (named ones live on until ``shutdown``)."""
        if self.name is None:
            self.shutdown()
        self._head.close()

    def shutdown(self) -> None:
        """Stop every group actor, named ones included."""
        for a in getattr(getattr(self, "backend", None), "actors", []):
            try:
                self.backend.ray.kill(a, no_restart=True)
            except Exception:  # already gone
                pass
