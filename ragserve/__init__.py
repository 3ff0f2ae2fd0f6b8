"""ragserve: exact Lucene-BM25 retrieval on CPU, GPU and FPGA, and the RAG loops that use it."""

__version__ = "0.1.0"
