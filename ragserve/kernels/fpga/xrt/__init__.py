"""The FPGA kernel on an Alveo card through Xilinx XRT's Python binding ``pyxrt``: ``backend`` (``fpga``)."""
