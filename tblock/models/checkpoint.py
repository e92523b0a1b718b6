"""Reading a Hugging Face checkpoint folder: config.json and safetensors files, any model.

    ckpt = Checkpoint("path/to/model")          # model.safetensors, or shards and their index
    hf = ckpt.config()                          # config.json as a dict
    ckpt.tensors["wte.weight"]                  # a TensorEntry: its file, dtype, shape, bytes
    a = ckpt.read("wte.weight", np.float32)     # the values, F16/BF16/F32/F64 widened exactly

A checkpoint is a user's download, so every file is treated as hostile until checked:

- every path opened is resolved (symlinks followed) and must lie inside the folder;
- every safetensors header is checked against the format's spec and the file's size
  before any tensor is read: an 8-byte little-endian header length, a JSON object
  {name: {dtype, shape, data_offsets}} of at most MAX_JSON_BYTES, then the data, which the
  tensors tile exactly (no overlap, no hole, nothing past the end);
- a tensor's memory is allocated only after its byte count has been checked against the
  file, so no config or header can make the loader allocate more than the files hold.

Every error is a ValueError naming the file and what is wrong (FileNotFoundError when the
folder or its weights are missing).  The format is read here directly rather than through
the safetensors package, whose errors name no file and whose NumPy API has no bfloat16.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from ..weights import check_finite

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
# safetensors' own bound on a header; config.json and the index are held to it too
MAX_JSON_BYTES = 100_000_000
# bits per element of every dtype the format defines (so any valid header can be checked)
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
              "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "I64": 64, "U64": 64,
              "F64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
# the float dtypes a model's weights may have, as the little-endian words they are stored in
# (a bfloat16 is the top half of a float32, read as a 16-bit word and shifted: exact)
FLOAT_CODES = {"F16": "<f2", "BF16": "<u2", "F32": "<f4", "F64": "<f8"}


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies: ``file``, its ``dtype`` code and ``shape``, and its bytes
    ``start`` .. ``start + nbytes`` counted from the file's beginning."""
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    nbytes: int


def inside(root: Path, name, what: str) -> Path:
    """root / name resolved, refused unless it lies inside root (root itself resolved):
    what names the entry for the error."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(f"{what} must name a file in {root}, got {name!r}")
    if os.path.isabs(name):
        raise ValueError(f"{what} is {name!r}, an absolute path: a checkpoint's files lie inside its folder {root}")
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"{what} is {name!r}, which leads outside the checkpoint's folder {root} (to {path})")
    return path


def read_json(path: Path, what: str):
    """The JSON value in ``path``, bounded in size and depth."""
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_JSON_BYTES + 1)
    except OSError as e:
        raise ValueError(f"{path}: cannot be read: {e.strerror or e}") from None
    if len(text) > MAX_JSON_BYTES:
        raise ValueError(f"{path}: larger than {MAX_JSON_BYTES} bytes, too large for {what}")
    return parse_json(text, path, what)


def parse_json(text: bytes, path: Path, what: str):
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be {what}") from None
    except ValueError as e:         # JSONDecodeError, bad UTF-8, an integer too long to convert
        raise ValueError(f"{path}: not valid JSON ({what}): {e}") from None


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The tensors of one safetensors file, every entry checked against the spec and the
    file's size."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise ValueError(f"{path}: {size} bytes, too short for a safetensors file (8 bytes of header length)")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_JSON_BYTES:
                raise ValueError(f"{path}: a header length of {n} bytes, over the format's limit of {MAX_JSON_BYTES}")
            if n > size - 8:
                raise ValueError(f"{path}: truncated: a header of {n} bytes in a file of {size}")
            header = parse_json(f.read(n), path, "a safetensors header")
    except OSError as e:
        raise ValueError(f"{path}: cannot be read: {e.strerror or e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header must be a JSON object, got {type(header).__name__}")
    header.pop("__metadata__", None)
    base, data = 8 + n, size - 8 - n
    tensors = {name: _entry(path, name, info, base, data) for name, info in header.items()}
    _check_tiling(path, tensors, base, data)
    return tensors


def _entry(path: Path, name: str, info, base: int, data: int) -> TensorEntry:
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise ValueError(f"{where}: must be an object with dtype, shape and data_offsets, got {info!r:.200}")
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if code not in DTYPE_BITS:
        raise ValueError(f"{where}: unknown dtype {code!r:.40} (safetensors defines {', '.join(DTYPE_BITS)})")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise ValueError(f"{where}: shape must be a list of integers >= 0, got {shape!r:.200}")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise ValueError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, "
                         f"got {offsets!r:.200}")
    if offsets[1] > data:
        raise ValueError(f"{where}: data_offsets {offsets} pass the end of the file's {data} bytes of data "
                         f"(the file is truncated, or the offsets are wrong)")
    bits = DTYPE_BITS[code] * int(np.prod(shape, dtype=object))
    if bits != 8 * (offsets[1] - offsets[0]):
        raise ValueError(f"{where}: {offsets[1] - offsets[0]} bytes for shape {tuple(shape)} in {code}, "
                         f"which takes {bits / 8:g}")
    return TensorEntry(path, code, tuple(shape), base + offsets[0], offsets[1] - offsets[0])


def _check_tiling(path: Path, tensors: dict[str, TensorEntry], base: int, data: int) -> None:
    """The tensors' bytes must tile the data exactly, as the spec requires: an overlap
    would make two tensors share bytes, a hole hides bytes no tensor accounts for."""
    spans = sorted((e.start - base, e.start - base + e.nbytes, name) for name, e in tensors.items())
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if start < end:
            raise ValueError(f"{path}: tensors {first!r} and {second!r} overlap (bytes {start} .. {end} of the data)")
    at = 0
    for start, end, _ in spans + [(data, data, None)]:
        if start != at:
            raise ValueError(f"{path}: bytes {at} .. {start} of the data belong to no tensor")
        at = end


class Checkpoint:
    """A checkpoint folder: config.json and its safetensors weights (one file, or shards
    listed in model.safetensors.index.json), every header read and checked here."""

    def __init__(self, path):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
        given = Path(path)
        if not given.is_dir():
            raise FileNotFoundError(f"path must be a checkpoint directory, got {str(given)!r}, "
                                    f"which {'is a file' if given.exists() else 'does not exist'}")
        self.root = given.resolve()

    @cached_property
    def tensors(self) -> dict[str, TensorEntry]:
        """Every tensor of the weights' files by its stored name, its entry checked."""
        return self._weights()

    def config(self) -> dict:
        """config.json as a dict."""
        path = self.root / CONFIG
        if not path.exists():
            raise FileNotFoundError(f"{self.root}: no config.json")
        path = inside(self.root, CONFIG, CONFIG)
        hf = read_json(path, "a config")
        if not isinstance(hf, dict):
            raise ValueError(f"{path}: the config must be a JSON object, got {type(hf).__name__}")
        return hf

    def _weights(self) -> dict[str, TensorEntry]:
        root = self.root
        if (root / INDEX).exists():
            return self._sharded(inside(root, INDEX, INDEX))
        if (root / SINGLE).exists():
            return read_header(self._file(inside(root, SINGLE, SINGLE)))
        others = sorted(p.name for p in root.iterdir() if p.suffix in (".bin", ".pt", ".h5", ".msgpack"))
        hint = f" (found {', '.join(others)}: only safetensors checkpoints are read)" if others else ""
        raise FileNotFoundError(f"{root}: neither {SINGLE} nor {INDEX}{hint}")

    def _sharded(self, index: Path) -> dict[str, TensorEntry]:
        """{name: entry} over the shards the index lists; a tensor must be in its shard."""
        data = read_json(index, "a safetensors index")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: not a safetensors index (a JSON object whose 'weight_map' maps "
                             f"tensor names to file names)")
        headers: dict[Path, dict[str, TensorEntry]] = {}
        tensors = {}
        for name, file in weight_map.items():
            path = inside(self.root, file, f"{index}: tensor {name!r}'s file")
            if not path.exists():
                raise ValueError(f"{index}: tensor {name!r} is in {file!r}, which does not exist")
            if path not in headers:
                headers[path] = read_header(self._file(path))
            if name not in headers[path]:
                raise ValueError(f"{path}: tensor {name!r} is listed in the index but not in this file")
            tensors[name] = headers[path][name]
        return tensors

    @staticmethod
    def _file(path: Path) -> Path:
        if not path.is_file():
            raise ValueError(f"{path}: not a regular file")
        return path

    def read(self, name: str, dtype) -> np.ndarray:
        """Tensor ``name`` in ``dtype`` (float32 or float64), from a float dtype (F16, BF16,
        F32, F64): the stored values widened exactly, or rounded once to float32."""
        e = self.tensors[name]
        if e.dtype not in FLOAT_CODES:
            raise ValueError(f"{e.file}: tensor {name!r} must be F32, F16 or BF16 (or F64), got {e.dtype}")
        word = np.dtype(FLOAT_CODES[e.dtype])
        a = np.empty(e.nbytes // word.itemsize, dtype=word)     # sized from the checked header
        try:
            with open(e.file, "rb") as f:
                f.seek(e.start)
                got = f.readinto(a.view(np.uint8))
        except OSError as err:
            raise ValueError(f"{e.file}: cannot be read: {err.strerror or err}") from None
        if got != e.nbytes:
            raise ValueError(f"{e.file}: truncated while reading tensor {name!r} ({got} of {e.nbytes} bytes)")
        if e.dtype == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        return a.reshape(e.shape).astype(dtype, copy=False)

    def read_all(self, names: dict[str, str], want: dict[str, tuple], dtype, what: str) -> dict[str, np.ndarray]:
        """The tensors ``want`` (canonical name -> shape) of a ``what`` (e.g. "a GPT-2 LM with
        n_layer=12"), ``names`` mapping canonical names to stored ones: every one present, none
        extra, every shape checked from the headers before any read, values finite, in
        ``dtype``.  Every error names the tensor and its file."""
        missing = [n for n in want if n not in names]
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise ValueError(f"{self.root}: the checkpoint lacks {', '.join(repr(n) for n in missing[:5])}{more} "
                             f"(for {what})")
        extra = [names[n] for n in names if n not in want]
        if extra:
            more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
            raise ValueError(f"{self.root}: unexpected tensor {', '.join(repr(n) for n in extra[:5])}{more} "
                             f"({what} has no such weight)")
        for c, shape in want.items():
            e = self.tensors[names[c]]
            if e.shape != shape:
                raise ValueError(f"{e.file}: tensor {names[c]!r} must have shape {shape} for {what}, got {e.shape}")
        out = {}
        for c in want:
            a = self.read(names[c], dtype)
            try:
                check_finite(f"tensor {names[c]!r}", a)
            except ValueError as e:
                raise ValueError(f"{self.tensors[names[c]].file}: {e}") from None
            out[c] = a
        return out
