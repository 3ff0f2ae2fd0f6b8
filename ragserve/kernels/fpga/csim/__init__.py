"""The FPGA kernels' C simulation (g++, no card): ``library`` builds and loads the HLS sources, ``backend`` is
``fpga-sim``."""
