"""The memory-processing kernel library: relevancy scoring, reductions and top-k selection, one folder per device.

Every device folder (``cpu/``, ``gpu/``, ``fpga/``) names its stages alike: ``relevancy`` (scores into
accumulators), ``selection`` (exact top-k), ``planning``/``memory`` where the device needs them, and ``backend``
(the retrieval engine built on them). ``contract`` holds what every backend shares; ``registry`` chooses one.
"""
