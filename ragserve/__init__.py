"""ragserve: exact Lucene-BM25 retrieval on CPU, GPU and FPGA, and the RAG loops that use it."""

import indexer  # noqa: F401  (first: it points numba's kernel cache at the per-user cache directory)

__version__ = "0.1.0"
