"""The GPU kernels written in CUDA C, by stage: ``relevancy.cu``, ``planning.cu`` and ``selection.cu``, with
``kernels`` (their layout constants, compile options and launch signatures) and ``rtc`` (NVRTC compilation and
launches through the CUDA driver)."""
