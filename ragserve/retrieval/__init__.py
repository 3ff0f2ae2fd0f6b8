"""Retrieval over the kernel library: the BM25 searcher and the queue that shares a device backend."""
