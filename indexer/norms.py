"""Lucene's 1-byte document length norms (``SmallFloat.intToByte4`` / ``byte4ToInt``)."""
from __future__ import annotations

import numpy as np



def _long_to_int4(i: int) -> int:
    if i < 0:
        raise ValueError("length must be >= 0")
    num_bits = i.bit_length()
    if num_bits < 4:
        return i  # subnormal values are stored as they are
    shift = num_bits - 4
    encoded = (i >> shift) & 0x07  # the leading one bit is implicit
    return encoded | ((shift + 1) << 3)


def _int4_to_long(i: int) -> int:
    bits = i & 0x07
    shift = (i >> 3) - 1
    return bits if shift == -1 else (bits | 0x08) << shift


NUM_FREE_VALUES = 255 - _long_to_int4(2**31 - 1)  # = 24: lengths below it are exact


def int_to_byte4(n: int) -> int:
    if n < NUM_FREE_VALUES:
        return n
    return NUM_FREE_VALUES + _long_to_int4(n - NUM_FREE_VALUES)


def byte4_to_int(b: int) -> int:
    if b < NUM_FREE_VALUES:
        return b
    return NUM_FREE_VALUES + _int4_to_long(b - NUM_FREE_VALUES)


LENGTH_TABLE = np.array([byte4_to_int(i) for i in range(256)], dtype=np.int64)
LENGTH_TABLE_F32 = LENGTH_TABLE.astype(np.float32)

# Encoding by table lookup: the smallest byte whose bucket starts above n, minus one.
def encode_lengths(lengths: np.ndarray) -> np.ndarray:
    """Vectorised ``int_to_byte4`` for an array of token counts."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and lengths.min() < 0:
        raise ValueError("length must be >= 0")
    return (np.searchsorted(LENGTH_TABLE, lengths, side="right") - 1).astype(np.uint8)
