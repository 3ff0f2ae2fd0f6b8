"""Triton's interpreter before the fix of triton-lang/triton#9171 (the H200 image's Triton 3.6) turns a scalar into a
Python int with ``int(data)`` on its 1-element array, which NumPy 2.4 refuses ("only 0-dimensional arrays can be
converted to Python scalars"): every loop bounded by a program id or a scalar argument fails there. The harnesses
that run kernels interpreted call ``repair_scalar_index`` first; the kernels and the installed Triton stay as they
are (compiled code never takes this path)."""
from __future__ import annotations


def repair_scalar_index() -> None:
    from triton.runtime import interpreter

    patch = interpreter._patch_lang_tensor
    if getattr(patch, "repairs_scalar_index", False):
        return

    def patched(tensor, *args, **kwargs):
        patch(tensor, *args, **kwargs)
        # set after the interpreter's own: its scope restores the original __index__ when the kernel returns
        tensor.__index__ = lambda self: int(self.handle.data.item())

    patched.repairs_scalar_index = True
    interpreter._patch_lang_tensor = patched
