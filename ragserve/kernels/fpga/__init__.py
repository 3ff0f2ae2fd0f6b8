"""The FPGA kernels of the library. The HLS sources live in ``hls_bm25/``: ``bm25_topk`` does relevancy and selection
in one fused kernel (BM25 scoring into on-chip accumulators, then the exact top-k of each shard), ``attn_topk`` the
sparse attention methods' inner products, reduction and top-k. So the stages have no modules of their own here:
``backend`` is the host side of ``bm25_topk`` every target shares (shard images, query batches, the merge of the
per-shard top-k lists), ``attention`` drives ``attn_topk``.

Below them, by technology as ``gpu/cuda`` and ``gpu/triton``: ``xrt/`` (the kernel on an Alveo card through
``pyxrt``: the ``fpga`` backend) and ``csim/`` (the kernels' C simulation built with g++: the ``fpga-sim`` backend and
the library ``attention`` calls).
"""
