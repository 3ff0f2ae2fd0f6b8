"""The sub-commands of ``ragserve`` (one module each) and what several of them share."""
from __future__ import annotations

import argparse

from ragserve.cli import CliError

# The retrieval backend's default, for every command that takes --backend (search, eval, serve): the fastest
# this machine has. Every backend returns the same ids and scores, so the choice changes speed only.
DEFAULT_BACKEND = "auto"
BACKEND_HELP = ("retrieval backend: auto (the default: gpu where a CUDA GPU is usable, else cpu), cpu, gpu, "
                "fpga (with --xclbin) or fpga-sim")


def add_backend_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default=DEFAULT_BACKEND, help=BACKEND_HELP)


def check_backend(name: str, device_option: bool = False) -> None:
    """A gpu backend asked for where no GPU is usable: say so in the command line's words (the backend's own
    message names the Python argument). ``device_option``: the command has a ``--device`` for the backend (and
    it was not given)."""
    if name != "gpu":
        return
    from ragserve.kernels.registry import get_backend_class

    ok, why = get_backend_class("gpu").is_available()
    if not ok:
        also = "; --device cpu runs its kernels on the CPU" if device_option else ""
        raise CliError(f"the gpu backend cannot run here ({why}): use --backend cpu or auto{also}")


def check_cuda(asked: list[str]) -> None:
    """CUDA asked for by options (``asked``: e.g. ``["--device cuda:1"]``) where torch sees none: one line now,
    not an error when the model has loaded in the background."""
    if not asked:
        return
    import torch

    if not torch.cuda.is_available():
        raise CliError(f"{' and '.join(asked)} {'asks' if len(asked) == 1 else 'ask'} for CUDA, and no CUDA device "
                       f"is visible to torch here: use cpu or auto")
