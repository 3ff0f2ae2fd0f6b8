"""The FPGA kernels' HLS design (``bm25_topk``, ``attn_topk``): C++ sources, testbenches and the Makefile.

A package of sources, not of Python code: it ships in the wheel so that the ``fpga-sim`` backend compiles the
kernels' C simulation from an installed ragserve (``ragserve.kernels.fpga.csim.library`` finds them through
``importlib.resources``), and ``make -C`` this folder builds the hardware images. See README.md.
"""
