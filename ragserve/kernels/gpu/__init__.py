"""The GPU kernels of the library, by stage: ``planning`` (work items, tile plans, the device's query tables),
``relevancy`` (BM25 tile scoring; the dense torch reference), ``selection`` (exact top-k), ``attention`` (the sparse
attention methods' kernels), with ``memory`` (the device memory plan), ``graphs`` (a single query as one CUDA graph),
``pipeline`` (the tiled and dense search paths), ``backend`` (``GpuBackend``, which coordinates them) and
``settings`` (``GpuSettings``).

The kernels themselves sit below the stages, by technology and then by stage again: ``cuda/`` (``relevancy.cu``,
``planning.cu``, ``selection.cu``; ``cuda.kernels`` declares them, ``cuda.rtc`` compiles them with NVRTC) and
``triton/`` (``planning``, ``relevancy``, ``selection``, ``attention``; imported only where a Triton kernel runs)."""
