"""A GGUF file's quantized matrices as group-quantized int8 (``ragserve.kernels.cpu.decode.qmatvec``'s form).

Q8_0, Q5_0, Q4_K and Q6_K blocks become int8 ``q`` with an f32 scale ``a`` (and for Q4_K an offset ``c``) per group
of 32 (16 for Q6_K) inputs, unpacked as gguf-py de-quantizes them, so ``a * q - c`` in f32 is bit for bit the f32
matrix a transformers checkpoint converted from the GGUF holds. ``QuantMatrix.matches`` checks exactly that before
an engine reads a matrix this way: a model whose weights are not the GGUF's keeps its f32 path.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

QK_K = 256


@dataclass
class QuantMatrix:
    q: np.ndarray  # int8 [out, in]
    a: np.ndarray  # f32 [out, in // group]
    c: np.ndarray  # f32 [out, in // group], or shape (0, 0): no offsets
    group: int
    kind: str  # the GGUF type it came from

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.a.nbytes + self.c.nbytes

    def dequantize(self) -> np.ndarray:
        a = np.repeat(self.a, self.group, axis=1)
        w = a * self.q.astype(np.float32)
        if self.c.size:
            w = w - np.repeat(self.c, self.group, axis=1)
        return w

    def matches(self, weight: np.ndarray) -> bool:
        """Whether this matrix de-quantizes to exactly ``weight`` (f32 [out, in]), compared bit for bit."""
        if weight.shape != self.q.shape or weight.dtype != np.float32:
            return False
        step = max(1, (1 << 22) // max(1, weight.shape[1]))  # row chunks: a 671 MB matrix is not doubled at once
        for lo in range(0, weight.shape[0], step):
            part = QuantMatrix(self.q[lo:lo + step], self.a[lo:lo + step],
                               self.c[lo:lo + step] if self.c.size else self.c, self.group, self.kind)
            if not np.array_equal(part.dequantize().view(np.uint32), weight[lo:lo + step].view(np.uint32)):
                return False
        return True

    def concat(self, other: "QuantMatrix") -> "QuantMatrix | None":
        """Both matrices' rows as one (one kernel call for q, k and v), when they share the group form."""
        if self.group != other.group or bool(self.c.size) != bool(other.c.size):
            return None
        c = np.concatenate([self.c, other.c]) if self.c.size else self.c
        return QuantMatrix(np.concatenate([self.q, other.q]), np.concatenate([self.a, other.a]), c, self.group,
                           f"{self.kind}+{other.kind}")


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _q8_0(blocks: np.ndarray, rows: int):
    d, x = blocks[:, :2], blocks[:, 2:]
    return np.ascontiguousarray(x).view(np.int8).reshape(rows, -1), _f16(d).reshape(rows, -1), None, 32


def _q5_0(blocks: np.ndarray, rows: int):
    n = blocks.shape[0]
    d, qh, qs = blocks[:, :2], blocks[:, 2:6], blocks[:, 6:]
    qh = np.ascontiguousarray(qh).view(np.uint32).reshape(n, 1) >> np.arange(32, dtype=np.uint32).reshape(1, 32)
    ql = qs.reshape(n, -1, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    qh = (qh & np.uint32(1)).astype(np.uint8)
    ql = (ql & np.uint8(0x0F)).reshape(n, -1)
    q = (ql | (qh << np.uint8(4))).astype(np.int8) - np.int8(16)
    return q.reshape(rows, -1), _f16(d).reshape(rows, -1), None, 32


def _q4_k(blocks: np.ndarray, rows: int):
    from gguf.quants import Q4_K

    n = blocks.shape[0]
    d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:4 + Q4_K.K_SCALE_SIZE]))
    qs = blocks[:, 4 + Q4_K.K_SCALE_SIZE:]
    a = (d * sc.astype(np.float32)).reshape(n, -1)
    c = (dmin * m.astype(np.float32)).reshape(n, -1)
    qs = qs.reshape(n, -1, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & np.uint8(0x0F)).reshape(n, -1).astype(np.int8)
    return q.reshape(rows, -1), a.reshape(rows, -1), c.reshape(rows, -1), 32


def _q6_k(blocks: np.ndarray, rows: int):
    n = blocks.shape[0]
    ql, qh = blocks[:, :QK_K // 2], blocks[:, QK_K // 2:QK_K // 2 + QK_K // 4]
    scales, d = blocks[:, QK_K // 2 + QK_K // 4:QK_K // 2 + QK_K // 4 + QK_K // 16], blocks[:, -2:]
    a = (_f16(d) * np.ascontiguousarray(scales).view(np.int8).astype(np.float32)).reshape(n, -1)
    ql = ql.reshape(n, -1, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & np.uint8(0x0F)).reshape(n, -1, 32)
    qh = qh.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    qh = (qh & np.uint8(0x03)).reshape(n, -1, 32)
    q = (ql | (qh << np.uint8(4))).astype(np.int8) - np.int8(32)
    return q.reshape(rows, -1), a.reshape(rows, -1), None, 16


_UNPACK = {"Q8_0": (_q8_0, 34), "Q5_0": (_q5_0, 22), "Q4_K": (_q4_k, 144), "Q6_K": (_q6_k, 210)}


def unpack(kind: str, data: np.ndarray) -> QuantMatrix | None:
    """A GGUF tensor's raw blocks (uint8 [rows, row bytes]) as a ``QuantMatrix``; None for other types."""
    if kind not in _UNPACK:
        return None
    fn, block_bytes = _UNPACK[kind]
    rows = data.shape[0]
    q, a, c, group = fn(np.ascontiguousarray(data).reshape(-1, block_bytes), rows)
    empty = np.zeros((0, 0), np.float32)
    return QuantMatrix(np.ascontiguousarray(q), np.ascontiguousarray(a, dtype=np.float32),
                       empty if c is None else np.ascontiguousarray(c, dtype=np.float32), group, kind)


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def _skip_value(buf: bytes, pos: int, kind: int) -> int:
    """Position after one metadata value of GGUF type ``kind`` at ``pos`` (the value itself is not needed)."""
    if kind == _STRING:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    if kind == _ARRAY:
        item, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item in _SCALAR:
            return pos + count * struct.calcsize(_SCALAR[item])
        for _ in range(count):
            pos = _skip_value(buf, pos, item)
        return pos
    return pos + struct.calcsize(_SCALAR[kind])


def gguf_tensors(path: str | Path) -> list[tuple[str, str, np.ndarray]]:
    """Each tensor of a GGUF file (v2/v3) as (name, type name, raw data [rows, row bytes] memory-mapped). The
    metadata is skipped, not parsed: gguf-py's reader takes tens of seconds over a 262K-token vocabulary."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    raw = np.memmap(path, dtype=np.uint8, mode="r")
    head = bytes(raw[:24])
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", head)
    if magic != b"GGUF" or version < 2:
        raise ValueError(f"{path}: not a GGUF v2+ file")
    # The metadata and tensor infos are at the start; read them in growing prefixes until they fit.
    size = 1 << 24
    while True:
        buf = bytes(raw[:size])
        try:
            pos, alignment = 24, 32
            for _ in range(n_kv):
                (n,) = struct.unpack_from("<Q", buf, pos)
                key = buf[pos + 8:pos + 8 + n]
                (kind,) = struct.unpack_from("<I", buf, pos + 8 + n)
                pos = pos + 12 + n
                if key == b"general.alignment":
                    (alignment,) = struct.unpack_from(_SCALAR[kind], buf, pos)
                pos = _skip_value(buf, pos, kind)
            infos = []
            for _ in range(n_tensors):
                (n,) = struct.unpack_from("<Q", buf, pos)
                name = buf[pos + 8:pos + 8 + n].decode()
                pos += 8 + n
                (dims,) = struct.unpack_from("<I", buf, pos)
                shape = struct.unpack_from(f"<{dims}Q", buf, pos + 4)
                kind, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * dims)
                pos += 4 + 8 * dims + 12
                infos.append((name, GGMLQuantizationType(kind), shape, offset))
            break
        except struct.error:
            if size >= raw.size:
                raise
            size *= 4
    start = (pos + alignment - 1) // alignment * alignment
    out = []
    for name, kind, shape, offset in infos:
        block, block_bytes = GGML_QUANT_SIZES[kind]
        rows = int(np.prod(shape[1:], dtype=np.int64))
        row_bytes = shape[0] // block * block_bytes
        at = start + offset
        out.append((name, kind.name, raw[at:at + rows * row_bytes].reshape(rows, row_bytes)))
    return out


def read_gguf(path: str | Path) -> dict[str, QuantMatrix]:
    """The quantized matrices of a GGUF file by tensor name (``blk.0.attn_q.weight``, ``token_embd.weight``)."""
    out = {}
    for name, kind, data in gguf_tensors(path):
        m = unpack(kind, data)
        if m is not None:
            out[name] = m
    return out
