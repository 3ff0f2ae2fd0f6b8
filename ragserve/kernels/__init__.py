"""The memory-processing kernel library: relevancy scoring, reductions and top-k selection, one folder per device.

Every device folder (``cpu/``, ``gpu/``, ``fpga/``) names its stages alike: ``relevancy`` (scores into
accumulators), ``selection`` (exact top-k), ``attention`` (the sparse attention methods' operations),
``planning``/``memory``/``pipeline`` where the device needs them, and ``backend`` (the retrieval engine built on
them). Code specific to one technology sits below the stages, in a folder of its own: ``gpu/cuda/`` and
``gpu/triton/``, ``fpga/xrt/`` and ``fpga/csim/``. The FPGA's BM25 kernel fuses relevancy and selection
(``hls_bm25/bm25_topk.cpp``), so ``fpga/`` has no stage modules for them (``fpga/__init__``). ``contract`` holds
what every backend shares; ``registry`` chooses one.
"""
