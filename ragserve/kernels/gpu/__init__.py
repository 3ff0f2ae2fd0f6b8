"""The GPU kernels of the library, by stage: ``planning`` (work items, tile plans, the device's query tables),
``relevancy`` (BM25 tile scoring; the dense torch reference), ``selection`` (exact top-k), with ``memory`` (the device
memory plan), ``graphs`` (a single query as one CUDA graph), ``backend`` (``GpuBackend``) and ``settings``
(``GpuSettings``). The CUDA C kernels are ``cuda/*.cu`` (``cuda_kernels``, compiled by NVRTC through ``rtc``); the
Triton ones ``triton_kernels``."""
