"""Reading a GGUF file (llama.cpp's format): its metadata and tensors, every size checked.

    g = GGUFFile("model.gguf")
    g.metadata["general.architecture"]       # 'llama': every key's value (arrays included)
    g.tensors["blk.0.attn_q.weight"]         # a GGUFTensor: its type, shape and bytes' place
    g.read("blk.0.attn_q.weight")            # float32 array, or a tblock QuantizedMatrix

The layout (GGUF versions 2 and 3, little-endian; version 1 is refused, as llama.cpp does):

    "GGUF" magic, u32 version, u64 tensor count, u64 metadata count
    metadata: key (string), u32 value type, value; a string is a u64 byte count then UTF-8;
              an array is a u32 element type, a u64 count, then the elements (never arrays)
    tensor infos: name (string), u32 n_dims, u64 ne[n_dims] (ne[0] varies fastest), u32 ggml
              type, u64 offset into the data
    padding to general.alignment (a u32 power of 2, 32 when absent), then the data

A file is a user's download, so it is hostile until checked: every count, length and offset
is checked against the bytes the file has before anything is allocated from it (a count of
elements is checked against the bytes they would need), names are bounded as ggml bounds
them, and the tensors must lie in the data as llama.cpp's loader requires: in the order of
their infos, each at the previous one's end rounded up to the alignment (so no overlap, no
misaligned or out-of-range tensor).  Every error is a ValueError naming the file.

Tensors are read with ``read``, not memory-mapped: a map of a file that is truncated later
faults the process (SIGBUS), and tblock copies every weight into private read-only arrays
anyway.  Types read: F32 and F16 (float32 arrays), BF16 (a 2-D one as a QuantizedMatrix
"bf16", others widened exactly to float32), Q8_0 and Q4_0 (2-D only, as QuantizedMatrix
"int8" and "int4": tblock's formats are these blocks byte for byte, so the bytes are taken
as they are).  A 2-D tensor with ne = (n_in, n_out) holds n_out rows of n_in values, as
tblock's stored formats hold a (d_in, d_out) matrix, so the QuantizedMatrix has shape
(n_in, n_out) and its ``data`` is the file's bytes.  Any other type is refused when read,
naming the tensor and its type; a file with them still opens (its layout is checked).

This is tblock's own reader rather than the ``gguf`` package's GGUFReader, which takes the
header's counts on trust: with gguf 0.19 a huge tensor count fails with NumPy's IndexError
(no file named), a string longer than the file is accepted cut short, and a huge array count
makes it allocate until the process is killed.  It would also be a runtime dependency for a
format that takes a few hundred lines to read safely.  The tests use the gguf package as an
independent writer and reader.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..formats import BLOCK_BYTES, QBLOCK, QuantizedMatrix

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4                    # ggml's GGML_MAX_DIMS
MAX_NAME = 63                   # bytes of a tensor name: ggml's GGML_MAX_NAME less its NUL
MAX_KEY = 65535                 # bytes of a metadata key (the spec's bound)

# metadata value types: id -> (name, struct code) for the fixed-size ones
SCALARS = {0: ("u8", "B"), 1: ("i8", "b"), 2: ("u16", "H"), 3: ("i16", "h"), 4: ("u32", "I"),
           5: ("i32", "i"), 6: ("f32", "f"), 7: ("bool", "b"), 10: ("u64", "Q"), 11: ("i64", "q"),
           12: ("f64", "d")}
STRING, ARRAY = 8, 9
TYPE_NAMES = {**{t: name for t, (name, _) in SCALARS.items()}, STRING: "string", ARRAY: "array"}

# ggml tensor types: id -> (name, values per block, bytes per block), every type a GGUF file
# may hold (so that any valid file's layout can be checked); the ids ggml retired are absent
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
    42: ("Q2_0", 64, 18),
}
READ_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0")       # the types ``read`` returns
BLOCKED = {"Q8_0": "int8", "Q4_0": "int4"}                  # ggml type -> tblock format
assert all(GGML_TYPES[t][1:] == (QBLOCK, BLOCK_BYTES[f]) for t, f in ((8, "int8"), (2, "int4")))


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor's info: ``name``, its ggml ``type`` name, ``shape`` in NumPy's order (ne
    reversed: a matrix is (rows, values a row)), and its bytes ``start`` .. ``start +
    nbytes`` counted from the file's beginning."""
    name: str
    type: str
    shape: tuple[int, ...]
    start: int
    nbytes: int


class _Cursor:
    """Reads the header in order, each read checked against the bytes the file has left."""

    def __init__(self, f, size: int, path: Path):
        self.f, self.size, self.path, self.pos = f, size, path, 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{self.path}: {what}")

    def take(self, n: int, what: str) -> bytes:
        left = self.size - self.pos
        if n > left:
            raise self.fail(f"truncated: {what} needs {n} bytes at offset {self.pos}, the file has {left} left")
        b = self.f.read(n)
        if len(b) != n:
            raise self.fail(f"changed while being read: {what} at offset {self.pos} ({len(b)} of {n} bytes)")
        self.pos += n
        return b

    def scalar(self, code: str, what: str):
        return struct.unpack("<" + code, self.take(struct.calcsize(code), what))[0]

    def count(self, what: str, least: int) -> int:
        """A u64 count of items that take at least ``least`` bytes each, bounded by the file."""
        n = self.scalar("Q", what)
        if n * least > self.size - self.pos:
            raise self.fail(f"{what} is {n}, but the {self.size - self.pos} bytes left hold at most "
                            f"{(self.size - self.pos) // least} (each takes at least {least} bytes)")
        return n

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.scalar("Q", f"{what}'s length")
        if limit is not None and n > limit:
            raise self.fail(f"{what} is {n} bytes long, over the limit of {limit}")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8: {raw[:60]!r}") from None


def _open(path) -> tuple[Path, object]:
    """(path, binary file) of a regular file, refused before anything blocks on it."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; the fstat below refuses it
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise ValueError(f"{path}: cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{path}: not a regular file")
    return path, os.fdopen(fd, "rb")


class GGUFFile:
    """A GGUF file's header: ``version``, ``metadata`` {key: value}, ``tensors`` {name:
    GGUFTensor} in the file's order, ``alignment``; ``read(name)`` gives a tensor's values.
    Metadata values: ints, floats, bools and strs; arrays of numbers or bools as read-only
    NumPy arrays, arrays of strings as lists; ``value_types`` {key: its GGUF type's name,
    e.g. "u32", "f32", "string", "array"}."""

    def __init__(self, path):
        self.path, f = _open(path)
        with f:
            size = os.fstat(f.fileno()).st_size
            cur = _Cursor(f, size, self.path)
            self._read_header(cur)
            self.metadata = self._read_metadata(cur)
            self.alignment = self._alignment()
            infos = self._read_infos(cur)
            self.data_start = -(-cur.pos // self.alignment) * self.alignment
            self.tensors = self._layout(infos, size)

    def __repr__(self):
        return f"GGUFFile({str(self.path)!r}, version={self.version}, tensors={len(self.tensors)})"

    def _fail(self, what: str) -> ValueError:
        return ValueError(f"{self.path}: {what}")

    def _read_header(self, cur: _Cursor) -> None:
        magic = cur.take(4, "the magic 'GGUF'")
        if magic != MAGIC:
            raise self._fail(f"not a GGUF file: it begins with {magic!r}, not {MAGIC!r}")
        version = cur.scalar("I", "the version")
        if version not in VERSIONS:
            why = ("a big-endian file (or a corrupt version): only little-endian GGUF files are read"
                   if version & 0xFFFF == 0 else
                   "version 1 is no longer read (llama.cpp dropped it too)" if version == 1 else "an unknown version")
            raise self._fail(f"GGUF version {version} is not supported ({why}); versions {VERSIONS} are")
        self.version = version
        # each tensor info takes at least 24 bytes (empty name, no dims), each key-value 13
        self._n_tensors = cur.count("the tensor count", 24)
        self._n_kv = cur.count("the metadata count", 13)

    def _read_metadata(self, cur: _Cursor) -> dict:
        meta, self.value_types = {}, {}
        for i in range(self._n_kv):
            key = cur.string(f"metadata key {i}", MAX_KEY)
            if not key:
                raise self._fail(f"metadata key {i} is empty")
            if key in meta:
                raise self._fail(f"metadata key {key!r} appears twice")
            meta[key] = self._value(cur, key)
        return meta

    def _value(self, cur: _Cursor, key: str):
        what = f"metadata {key!r}"
        vtype = cur.scalar("I", f"{what}'s type")
        self.value_types[key] = TYPE_NAMES.get(vtype, str(vtype))
        if vtype != ARRAY:
            return self._scalar(cur, vtype, what)
        etype = cur.scalar("I", f"{what}'s element type")
        if etype == ARRAY:
            raise self._fail(f"{what} is an array of arrays, which GGUF readers do not accept")
        if etype not in TYPE_NAMES:
            raise self._fail(f"{what} is an array of unknown type {etype}")
        if etype == STRING:
            n = cur.count(f"{what}'s length", 8)
            return [cur.string(f"{what}[{j}]") for j in range(n)]
        code = SCALARS[etype][1]
        n = cur.count(f"{what}'s length", struct.calcsize(code))
        a = np.frombuffer(cur.take(n * struct.calcsize(code), what), dtype="<" + code)
        a = (a != 0) if etype == 7 else a.astype(a.dtype.newbyteorder("="), copy=False)
        a.flags.writeable = False
        return a

    def _scalar(self, cur: _Cursor, vtype: int, what: str):
        if vtype == STRING:
            return cur.string(what)
        if vtype not in SCALARS:
            raise self._fail(f"{what} has unknown value type {vtype}")
        value = cur.scalar(SCALARS[vtype][1], what)
        return bool(value) if vtype == 7 else value

    def _alignment(self) -> int:
        if "general.alignment" not in self.metadata:
            return DEFAULT_ALIGNMENT
        a = self.metadata["general.alignment"]
        if self.value_types["general.alignment"] != "u32" or a == 0:
            raise self._fail(f"general.alignment must be a u32 above 0, got {self.value_types['general.alignment']} "
                             f"{a!r:.60}")
        if a & (a - 1):
            raise self._fail(f"general.alignment must be a power of 2, got {a}")
        return a

    def _read_infos(self, cur: _Cursor) -> dict[str, tuple]:
        infos = {}
        for i in range(self._n_tensors):
            name = cur.string(f"tensor {i}'s name", MAX_NAME)
            if name in infos:
                raise self._fail(f"tensor {name!r} appears twice")
            what = f"tensor {name!r}"
            n_dims = cur.scalar("I", f"{what}'s number of dimensions")
            if n_dims > MAX_DIMS:
                raise self._fail(f"{what} has {n_dims} dimensions, more than ggml's {MAX_DIMS}")
            ne = [cur.scalar("Q", f"{what}'s dimension {j}") for j in range(n_dims)]
            type_id = cur.scalar("I", f"{what}'s type")
            offset = cur.scalar("Q", f"{what}'s offset")
            infos[name] = (ne, type_id, offset)
        return infos

    def _layout(self, infos: dict[str, tuple], size: int) -> dict[str, GGUFTensor]:
        """The infos made into GGUFTensors, each where llama.cpp's loader requires it: at the
        previous tensor's end rounded up to the alignment, its bytes inside the file."""
        data = size - self.data_start
        if infos and data < 0:
            raise self._fail(f"truncated: the data would start at byte {self.data_start} of a file of {size}")
        tensors, at = {}, 0
        for name, (ne, type_id, offset) in infos.items():
            what = f"tensor {name!r}"
            if type_id not in GGML_TYPES:
                raise self._fail(f"{what} has ggml type {type_id}, which is not a type GGUF files hold")
            tname, per_block, block_bytes = GGML_TYPES[type_id]
            if ne and ne[0] % per_block:
                raise self._fail(f"{what} is {tname}, whose blocks hold {per_block} values, but its rows "
                                 f"have {ne[0]}")
            nbytes = int(np.prod(ne, dtype=object)) // per_block * block_bytes
            if offset % self.alignment:
                raise self._fail(f"{what}'s offset {offset} is not a multiple of the alignment {self.alignment}")
            if offset != at:
                why = "overlaps the tensor before it" if offset < at else "leaves a gap after the tensor before it"
                raise self._fail(f"{what} lies at offset {offset} of the data, expected {at}: it {why} "
                                 f"(tensors lie in order, each at the previous one's aligned end)")
            if offset + nbytes > data:
                raise self._fail(f"truncated: {what} ({tname}, shape {tuple(reversed(ne))}) takes bytes "
                                 f"{offset} .. {offset + nbytes} of the data, which has {max(data, 0)}")
            tensors[name] = GGUFTensor(name, tname, tuple(reversed(ne)), self.data_start + offset, nbytes)
            at = -(-(offset + nbytes) // self.alignment) * self.alignment
        return tensors

    # ------------------------------------------------------------------------- tensor data

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of tensor ``name`` (uint8, its checked byte count)."""
        t = self.tensors[name]
        a = np.empty(t.nbytes, np.uint8)            # sized from the checked layout
        try:
            with open(self.path, "rb") as f:
                f.seek(t.start)
                got = f.readinto(a)
        except OSError as e:
            raise self._fail(f"cannot be read: {e.strerror or e}") from None
        if got != t.nbytes:
            raise self._fail(f"truncated while reading tensor {name!r} ({got} of {t.nbytes} bytes)")
        return a

    def read(self, name: str):
        """Tensor ``name``'s values: F32/F16 (and a BF16 that is not 2-D) as a float32 array of
        its shape, a 2-D BF16/Q8_0/Q4_0 as a QuantizedMatrix (module docstring).  Other
        types, non-finite floats and non-finite block scales are refused, naming the tensor."""
        if name not in self.tensors:
            raise KeyError(f"{self.path}: no tensor {name!r}")
        t = self.tensors[name]
        if t.type not in READ_TYPES:
            raise self._fail(f"tensor {name!r} is {t.type}, a type tblock does not read "
                             f"(it reads {', '.join(READ_TYPES)})")
        if t.type in BLOCKED or (t.type == "BF16" and len(t.shape) == 2):
            return self._matrix(t)
        words = self.raw(name).view({"F32": "<f4", "F16": "<f2", "BF16": "<u2"}[t.type])
        if t.type == "BF16":
            a = (words.astype(np.uint32) << 16).view(np.float32)        # exact: bf16 is float32's top half
        else:
            a = words.astype(np.float32)
        if not np.isfinite(a).all():
            bad = int(np.argmin(np.isfinite(a)))
            raise self._fail(f"tensor {name!r} must be finite, found {a[bad]} at flat index {bad}")
        return a.reshape(t.shape)

    def _matrix(self, t: GGUFTensor) -> QuantizedMatrix:
        if len(t.shape) != 2 or 0 in t.shape:
            raise self._fail(f"tensor {t.name!r} is {t.type} with shape {t.shape}: tblock reads a {t.type} "
                             f"tensor as a matrix, which must be 2-D and not empty")
        rows, n_in = t.shape
        fmt = BLOCKED.get(t.type, "bf16")
        data = self.raw(t.name)
        data = data.view("<u2").astype(np.uint16) if fmt == "bf16" else data
        try:
            return QuantizedMatrix(fmt, (n_in, rows), data.reshape(rows, -1))
        except ValueError as e:         # a NaN or Inf among the values or the block scales
            raise self._fail(f"tensor {t.name!r} ({t.type}): {e}") from None
