"""GGUF files (tblock.models.gguf_file, tblock.models.gguf): values, names and hostile files.

The files are written here by a small writer of this test's own (``gguf_bytes``: the
format's spec, nothing from the reader), so the bytes can be damaged one field at a time;
where the ``gguf`` package (llama.cpp's gguf-py, the interop extra) is installed, its
GGUFWriter and GGUFReader check the reader from the other side.  The quantized tensors'
bytes are tblock.formats' (which tests/interop/test_gguf_bytes.py holds equal to llama.cpp's
quantizers), and the values they stand for are decoded here independently.
"""

import os
import struct
import threading
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tblock.formats import QuantizedMatrix, quantize_matrix
from tblock.models.gguf import read_gguf_model, split_outputs
from tblock.models.gguf_file import GGML_TYPES, GGUFFile

# ----------------------------------------------------------------------------- a writer

VTYPES = {"u8": (0, "B"), "i8": (1, "b"), "u16": (2, "H"), "i16": (3, "h"), "u32": (4, "I"), "i32": (5, "i"),
          "f32": (6, "f"), "bool": (7, "B"), "str": (8, None), "u64": (10, "Q"), "i64": (11, "q"), "f64": (12, "d")}
F32, F16, Q4_0, Q8_0, Q4_K, BF16 = 0, 1, 2, 8, 12, 30


def gstr(s) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value_bytes(vt: str, v) -> bytes:
    return gstr(v) if vt == "str" else struct.pack("<" + VTYPES[vt][1], v)


def kv_bytes(key, vt: str, v) -> bytes:
    """One metadata pair; vt "arr:T" is an array of T."""
    if vt.startswith("arr:"):
        et = vt[4:]
        return (gstr(key) + struct.pack("<IIQ", 9, VTYPES[et][0], len(v))
                + b"".join(value_bytes(et, x) for x in v))
    return gstr(key) + struct.pack("<I", VTYPES[vt][0]) + value_bytes(vt, v)


def tensor(name, ne, ttype, data: bytes, **override) -> dict:
    return {"name": name, "ne": list(ne), "type": ttype, "data": data, **override}


def gguf_bytes(kvs, tensors, *, version=3, alignment=32, magic=b"GGUF") -> bytes:
    """A GGUF file: kvs [(key, vtype, value)], tensors [tensor(...)] laid out in order, each
    padded to ``alignment`` (a tensor's "offset" key overrides where its info says it is)."""
    out = magic + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kv_bytes(*kv) for kv in kvs)
    data, at = b"", 0
    for t in tensors:
        out += gstr(t["name"]) + struct.pack(f"<I{len(t['ne'])}QIQ", len(t["ne"]), *t["ne"], t["type"],
                                              t.get("offset", at))
        data += t["data"] + bytes(-len(t["data"]) % alignment)
        at = len(data)
    return out + bytes(-len(out) % alignment) + data


def write(tmp_path, raw: bytes, name="m.gguf"):
    p = tmp_path / name
    p.write_bytes(raw)
    return p


def f32(a) -> bytes:
    return np.ascontiguousarray(a, "<f4").tobytes()


# ----------------------------------------------------------------------------- independent decoders

def decode_q8_0(raw: bytes, rows: int, n_in: int) -> np.ndarray:
    """(rows, n_in) values of Q8_0 blocks: a float16 scale d, then 32 int8 q; value d * q."""
    out = np.empty((rows, n_in))
    for r in range(rows):
        for b in range(n_in // 32):
            block = raw[(r * n_in // 32 + b) * 34:][:34]
            d = np.frombuffer(block[:2], "<f2")[0]
            out[r, b * 32:(b + 1) * 32] = float(d) * np.frombuffer(block[2:], np.int8)
    return out


def decode_q4_0(raw: bytes, rows: int, n_in: int) -> np.ndarray:
    """Q4_0: a float16 d, then 16 bytes: byte j = value j (low nibble), value j + 16 (high)."""
    out = np.empty((rows, n_in))
    for r in range(rows):
        for b in range(n_in // 32):
            block = raw[(r * n_in // 32 + b) * 18:][:18]
            d = float(np.frombuffer(block[:2], "<f2")[0])
            for j, byte in enumerate(block[2:]):
                out[r, b * 32 + j] = d * ((byte & 15) - 8)
                out[r, b * 32 + j + 16] = d * ((byte >> 4) - 8)
    return out


# ----------------------------------------------------------------------------- every type

@pytest.fixture
def rng():
    return np.random.default_rng(33)


def test_every_tensor_type_reads_to_its_values(tmp_path, rng):
    A = rng.standard_normal((3, 64)).astype(np.float32)         # (rows, values a row)
    W = rng.standard_normal((64, 5)).astype(np.float32)         # (d_in, d_out): stored as 5 rows of 64
    q8, q4, bf = (quantize_matrix(W, f).data.tobytes() for f in ("int8", "int4", "bf16"))
    half = A.astype("<f2")
    bf_vec = (A[0].view(np.uint32) >> 16).astype("<u2")        # bf16 by truncation: exact in float32
    raw = gguf_bytes([], [tensor("f32", (64, 3), F32, f32(A)), tensor("f16", (64, 3), F16, half.tobytes()),
                          tensor("q8", (64, 5), Q8_0, q8), tensor("q4", (64, 5), Q4_0, q4),
                          tensor("bf", (64, 5), BF16, bf), tensor("bf1", (64,), BF16, bf_vec.tobytes()),
                          tensor("vec", (7,), F32, f32(np.arange(7))),
                          tensor("cube", (32, 2, 3), F32, f32(np.arange(192)))])
    g = GGUFFile(write(tmp_path, raw))
    assert [(t.name, t.type, t.shape) for t in g.tensors.values()] == [
        ("f32", "F32", (3, 64)), ("f16", "F16", (3, 64)), ("q8", "Q8_0", (5, 64)), ("q4", "Q4_0", (5, 64)),
        ("bf", "BF16", (5, 64)), ("bf1", "BF16", (64,)), ("vec", "F32", (7,)), ("cube", "F32", (3, 2, 32))]
    a = g.read("f32")
    assert a.dtype == np.float32 and np.array_equal(a, A)
    assert np.array_equal(g.read("f16"), half.astype(np.float64))
    assert np.array_equal(g.read("vec"), np.arange(7))
    assert np.array_equal(g.read("cube"), np.arange(192).reshape(3, 2, 32))
    assert np.array_equal(g.read("bf1"), (bf_vec.astype(np.uint32) << 16).view(np.float32))
    for name, fmt, decode in (("q8", "int8", decode_q8_0), ("q4", "int4", decode_q4_0), ("bf", "bf16", None)):
        m = g.read(name)
        assert isinstance(m, QuantizedMatrix) and (m.format, m.shape) == (fmt, (64, 5))
        assert m.data.tobytes() == {"q8": q8, "q4": q4, "bf": bf}[name]          # the file's bytes as they are
        if decode:
            assert np.array_equal(m.dequantize(np.float64), decode({"q8": q8, "q4": q4}[name], 5, 64).T)
    bf_values = (np.frombuffer(bf, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(5, 64)
    assert np.array_equal(g.read("bf").dequantize(), bf_values.T)


def test_every_metadata_type_and_version_2(tmp_path):
    kvs = [("a.u8", "u8", 255), ("a.i8", "i8", -128), ("a.u16", "u16", 65535), ("a.i16", "i16", -32768),
           ("a.u32", "u32", 2**32 - 1), ("a.i32", "i32", -2**31), ("a.f32", "f32", 0.5), ("a.t", "bool", 1),
           ("a.f", "bool", 0), ("a.s", "str", "héllo"), ("a.u64", "u64", 2**64 - 1), ("a.i64", "i64", -2**63),
           ("a.f64", "f64", 1e300), ("a.empty", "str", ""), ("a.toks", "arr:str", ["a", "", "ü€"]),
           ("a.ints", "arr:i32", [1, -2, 3]), ("a.fl", "arr:f32", [0.25, -1.5]), ("a.bools", "arr:bool", [1, 0]),
           ("a.none", "arr:u64", []), ("general.alignment", "u32", 64)]
    for version in (2, 3):
        g = GGUFFile(write(tmp_path, gguf_bytes(kvs, [tensor("x", (2,), F32, f32([1, 2]))], version=version,
                                                alignment=64)))
        m = g.metadata
        assert g.version == version and g.alignment == 64 and g.tensors["x"].start % 64 == 0
        assert [m[k] for k, *_ in kvs[:14]] == [255, -128, 65535, -32768, 2**32 - 1, -2**31, 0.5, True, False,
                                                "héllo", 2**64 - 1, -2**63, 1e300, ""]
        assert m["a.toks"] == ["a", "", "ü€"] and m["a.ints"].tolist() == [1, -2, 3]
        assert m["a.fl"].tolist() == [0.25, -1.5] and m["a.bools"].tolist() == [True, False]
        assert m["a.none"].size == 0 and not m["a.ints"].flags.writeable
        assert np.array_equal(g.read("x"), [1, 2])


def test_the_type_table_is_ggmls():
    gguf = pytest.importorskip("gguf", reason="the gguf package (the interop extra) holds ggml's table")
    theirs = {int(t): (t.name, *gguf.GGML_QUANT_SIZES[t]) for t in gguf.GGMLQuantizationType}
    # gguf-py before llama.cpp's late-2026 trees gives Q8_1 40 bytes (two float32s); ggml's
    # block_q8_1 is two halves and 32 int8 (its static_assert: 36), which newer gguf-py has
    if theirs.get(9) == ("Q8_1", 32, 40):
        theirs[9] = ("Q8_1", 32, 36)
    assert set(theirs) <= set(GGML_TYPES)       # newer types than the package knows may be in ours
    assert {k: GGML_TYPES[k] for k in theirs} == theirs


# ----------------------------------------------------------------------------- the gguf package's files

@settings(max_examples=25, deadline=None)
@given(fmt=st.sampled_from(["int8", "int4", "bf16"]), blocks=st.integers(1, 4), rows=st.integers(1, 9),
       scale=st.sampled_from([1e-6, 1e-2, 1.0, 300.0]), seed=st.integers(0, 2**32 - 1))
def test_files_the_gguf_package_writes(tmp_path_factory, fmt, blocks, rows, scale, seed):
    """ggml's quantizers (gguf.quants, which llama.cpp's converter runs) and tblock's give the
    same bytes, and the gguf package's reader sees what ours does."""
    gguf = pytest.importorskip("gguf", reason="the gguf package (the interop extra) writes the files")
    from gguf import quants
    qtype = {"int8": gguf.GGMLQuantizationType.Q8_0, "int4": gguf.GGMLQuantizationType.Q4_0,
             "bf16": gguf.GGMLQuantizationType.BF16}[fmt]
    rng = np.random.default_rng(seed)
    W = (rng.standard_normal((32 * blocks, rows)) * scale).astype(np.float32)      # (d_in, d_out)
    path = tmp_path_factory.mktemp("g") / "w.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_array("t.toks", ["x", "yz"])
    w.add_uint32("t.n", 7)
    w.add_tensor("w", quants.quantize(np.ascontiguousarray(W.T), qtype), raw_dtype=qtype)
    w.add_tensor("v", W[:, 0].copy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = GGUFFile(path)
    m = g.read("w")
    assert m.shape == W.shape and m.data.tobytes() == quantize_matrix(W, fmt).data.tobytes()
    assert np.array_equal(m.dequantize(), quants.dequantize(quants.quantize(np.ascontiguousarray(W.T), qtype),
                                                            qtype).T)
    assert np.array_equal(g.read("v"), W[:, 0])
    theirs = gguf.GGUFReader(path)
    assert [t.name for t in theirs.tensors] == list(g.tensors)
    for t in theirs.tensors:
        assert (g.tensors[t.name].start, g.tensors[t.name].nbytes) == (int(t.data_offset), int(t.n_bytes))
        assert g.tensors[t.name].shape == tuple(int(n) for n in reversed(t.shape))
    assert g.metadata["t.toks"] == ["x", "yz"] and g.metadata["t.n"] == 7
    assert g.metadata["general.architecture"] == "llama"


def test_q8_0_rounds_as_ggml_at_just_below_one_half():
    """x * (1/d) = +-0.49999997 (0.5 - 2**-25) rounds to 0 as ggml's roundf does (a float32
    floor(|v| + 0.5) rounded that sum up to 1.0)."""
    W = np.zeros((32, 1), np.float32)
    W[0, 0] = 127                                    # d = 1, so q = roundf(x)
    W[1, 0] = np.float32(0.5) - np.float32(2**-25)
    q = quantize_matrix(W, "int8").data.view(np.int8)[0, 2:]
    assert q[1] == 0                                 # C's roundf(0.49999997f) == 0


# ----------------------------------------------------------------------------- hostile files

def small_file() -> bytes:
    kvs = [("general.architecture", "str", "llama"), ("a.toks", "arr:str", ["a", "bc"]),
           ("a.n", "arr:i32", [1, 2]), ("general.alignment", "u32", 32)]
    return gguf_bytes(kvs, [tensor("a", (32, 2), Q8_0, bytes(68)), tensor("b", (3,), F32, f32([1, 2, 3]))])


def refused(tmp_path, raw, *needles, name="bad.gguf"):
    """The reader's error for the file ``raw``, under a small memory budget: a ValueError
    naming the file and each needle."""
    path = write(tmp_path, raw, name)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as e:
            g = GGUFFile(path)
            for n in g.tensors:
                g.read(n)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(e.value)
    assert msg.startswith(f"{path}: "), msg
    for n in needles:
        assert n in msg, (n, msg)
    assert peak < 4 << 20, f"{peak} bytes allocated to refuse {msg}"
    return msg


def test_truncated_anywhere(tmp_path):
    raw = small_file()
    end = len(raw) - 32 + 12            # the last tensor's last byte (its 12 bytes, then padding to 32)
    assert GGUFFile(write(tmp_path, raw[:end])).tensors["b"].nbytes == 12
    for cut in range(end):
        refused(tmp_path, raw[:cut], "truncated")


def test_wrong_magic_and_versions(tmp_path):
    raw = small_file()
    refused(tmp_path, b"GGML" + raw[4:], "not a GGUF file", "b'GGML'")
    refused(tmp_path, b"", "truncated")
    for version, why in ((1, "version 1"), (0x03000000, "big-endian"), (4, "unknown version"), (0, "")):
        refused(tmp_path, raw[:4] + struct.pack("<I", version) + raw[8:], f"GGUF version {version}", why)


@pytest.mark.parametrize("field", ["tensors", "kvs"])
def test_huge_counts(tmp_path, field):
    raw = bytearray(small_file())
    for n in (2**64 - 1, 2**63, 2**40):
        raw[8:24] = struct.pack("<QQ", n, 4) if field == "tensors" else struct.pack("<QQ", 2, n)
        refused(tmp_path, bytes(raw), "count is", str(n))


def test_huge_lengths(tmp_path):
    n = 2**64 - 1
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    refused(tmp_path, head + struct.pack("<Q", n) + bytes(32), "metadata key 0 is", "over the limit")
    refused(tmp_path, head + gstr("k") + struct.pack("<IQ", 8, 2**62) + b"abc", "metadata 'k'", "truncated")
    refused(tmp_path, head + gstr("k") + struct.pack("<IIQ", 9, 8, n) + gstr("a"), "metadata 'k''s length is",
            str(n))
    refused(tmp_path, head + gstr("k") + struct.pack("<IIQ", 9, 12, 2**61) + bytes(64), "metadata 'k''s length")
    long_name = gguf_bytes([], [tensor("x" * 64, (2,), F32, f32([1, 2]))])
    refused(tmp_path, long_name, "tensor 0's name is 64 bytes long")
    dims = gguf_bytes([], [tensor("x", (2**62, 2**62), F32, f32([1, 2]))])
    refused(tmp_path, dims, "truncated: tensor 'x'")
    five = gguf_bytes([], [tensor("x", (1, 1, 1, 1, 2), F32, f32([1, 2]))])
    refused(tmp_path, five, "tensor 'x' has 5 dimensions")


def test_offsets_and_layout(tmp_path):
    a, b = tensor("a", (32,), F32, f32(np.arange(32))), tensor("b", (8,), F32, f32(np.arange(8)))
    refused(tmp_path, gguf_bytes([], [a, dict(b, offset=64)]), "tensor 'b' lies at offset 64", "overlaps")
    refused(tmp_path, gguf_bytes([], [a, dict(b, offset=192)]), "tensor 'b' lies at offset 192", "gap")
    refused(tmp_path, gguf_bytes([], [a, dict(b, offset=130)]), "offset 130 is not a multiple of the alignment 32")
    refused(tmp_path, gguf_bytes([], [a, dict(b, offset=2**63)]), f"lies at offset {2**63}", "gap")
    refused(tmp_path, gguf_bytes([], [dict(a, offset=0), dict(b, offset=0)]), "overlaps")
    refused(tmp_path, gguf_bytes([], [dict(a, ne=[33])]), "truncated: tensor 'a'")
    refused(tmp_path, gguf_bytes([], [a, a]), "tensor 'a' appears twice")


def test_types_and_values(tmp_path):
    refused(tmp_path, gguf_bytes([], [tensor("t", (32,), 4, bytes(32))]), "tensor 't' has ggml type 4")
    refused(tmp_path, gguf_bytes([], [tensor("t", (32,), 2**31, bytes(32))]), "ggml type 2147483648")
    refused(tmp_path, gguf_bytes([], [tensor("k", (256,), Q4_K, bytes(144))]), "tensor 'k' is Q4_K",
            "tblock does not read", "Q8_0")
    refused(tmp_path, gguf_bytes([], [tensor("q", (48, 2), Q8_0, bytes(102))]), "tensor 'q' is Q8_0",
            "blocks hold 32 values", "rows have 48")
    refused(tmp_path, gguf_bytes([], [tensor("q", (64,), Q8_0, bytes(68))]), "tensor 'q' is Q8_0 with shape (64,)")
    nan = struct.pack("<e", float("nan")) + bytes(32)
    refused(tmp_path, gguf_bytes([], [tensor("q", (32, 1), Q8_0, nan)]), "tensor 'q' (Q8_0)", "not finite")
    refused(tmp_path, gguf_bytes([], [tensor("v", (2,), F32, f32([1, np.inf]))]), "tensor 'v' must be finite")
    refused(tmp_path, gguf_bytes([], [tensor("h", (32, 1), BF16, np.full(32, 0x7FC0, "<u2").tobytes())]),
            "tensor 'h' (BF16)")
    key = gguf_bytes([("k", "u8", 1), ("k", "u8", 2)], [])
    refused(tmp_path, key, "metadata key 'k' appears twice")
    refused(tmp_path, gguf_bytes([("", "u8", 1)], []), "metadata key 0 is empty")
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr("k")
    refused(tmp_path, head + struct.pack("<I", 13) + bytes(8), "metadata 'k' has unknown value type 13")
    refused(tmp_path, head + struct.pack("<IIQ", 9, 9, 1) + bytes(16), "array of arrays")
    refused(tmp_path, b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr(b"\xff\xfe") + bytes(8), "not valid UTF-8")
    refused(tmp_path, gguf_bytes([("general.alignment", "u32", 48)], []), "power of 2, got 48")
    refused(tmp_path, gguf_bytes([("general.alignment", "u64", 32)], []), "general.alignment must be a u32")
    refused(tmp_path, gguf_bytes([("general.alignment", "u32", 0)], []), "general.alignment must be a u32")


def test_not_a_regular_file(tmp_path):
    with pytest.raises(ValueError, match="not a regular file"):
        GGUFFile(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        GGUFFile(tmp_path / "absent.gguf")
    with pytest.raises(TypeError, match="path must be a str or a path"):
        GGUFFile(3)
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(ValueError, GGUFFile, fifo)), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "opening a FIFO blocked"
    assert "not a regular file" in str(errors[0].value)


# ----------------------------------------------------------------------------- models: names, config, permutation

def converter_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter's Q/K row order, by its definition: within each head, GGUF row
    2i + j holds HF row j * d_k/2 + i."""
    out = np.empty_like(w)
    d_k = w.shape[0] // n_heads
    for h in range(n_heads):
        for i in range(d_k // 2):
            for j in range(2):
                out[h * d_k + 2 * i + j] = w[h * d_k + j * d_k // 2 + i]
    return out


GGUF_OF_HF = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def llama_tensors(rng, L=2, d=64, heads=4, kv=2, ff=96, vocab=40, qkv_bias=False, tied=True) -> dict:
    """Hugging Face-named tensors of a random Llama-family model."""
    kvd = kv * d // heads
    t = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,)}
    if not tied:
        t["lm_head.weight"] = (vocab, d)
    for i in range(L):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": (d,), p + "self_attn.q_proj.weight": (d, d),
                  p + "self_attn.k_proj.weight": (kvd, d), p + "self_attn.v_proj.weight": (kvd, d),
                  p + "self_attn.o_proj.weight": (d, d), p + "post_attention_layernorm.weight": (d,),
                  p + "mlp.gate_proj.weight": (ff, d), p + "mlp.up_proj.weight": (ff, d),
                  p + "mlp.down_proj.weight": (d, ff)})
        if qkv_bias:
            t.update({p + "self_attn.q_proj.bias": (d,), p + "self_attn.k_proj.bias": (kvd,),
                      p + "self_attn.v_proj.bias": (kvd,)})
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in t.items()}


def gguf_name(hf: str) -> str:
    if hf.startswith("model.layers."):
        _, _, i, *rest = hf.split(".")
        return f"blk.{i}.{GGUF_OF_HF['.'.join(rest[:-1])]}.{rest[-1]}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[hf]


def llama_file(tmp_path, arch, hf_tensors, meta, fmt="fp32", permute=True, name="m.gguf", drop=(), extra=()):
    """A GGUF file of ``arch`` holding hf_tensors as llama.cpp's converter writes them: Q and K
    rows permuted (llama), 2-D tensors in ``fmt``, 1-D in F32."""
    heads, kv = meta["attention.head_count"], meta.get("attention.head_count_kv", meta["attention.head_count"])
    ts = []
    for hf, w in hf_tensors.items():
        if hf in drop:
            continue
        if permute and arch == "llama" and ".q_proj." in hf:
            w = converter_permute(w, heads)
        elif permute and arch == "llama" and ".k_proj." in hf:
            w = converter_permute(w, kv)
        ne = list(reversed(w.shape))
        if w.ndim == 2 and fmt != "fp32":
            ttype = {"int8": Q8_0, "int4": Q4_0, "bf16": BF16}[fmt]
            ts.append(tensor(gguf_name(hf), ne, ttype, quantize_matrix(w.T, fmt).data.tobytes()))
        else:
            ts.append(tensor(gguf_name(hf), ne, F32, f32(w)))
    ts += list(extra)
    kvs = [("general.architecture", "str", arch)]
    for k, v in meta.items():
        vt = "str" if isinstance(v, str) else "f32" if isinstance(v, float) else "u32"
        kvs.append((f"{arch}.{k}", vt, v))
    return write(tmp_path, gguf_bytes(kvs, ts), name)


def llama_meta(L=2, d=64, heads=4, kv=2, ff=96, **kw) -> dict:
    return {"block_count": L, "embedding_length": d, "attention.head_count": heads, "attention.head_count_kv": kv,
            "feed_forward_length": ff, "context_length": 128, "attention.layer_norm_rms_epsilon": 1e-5,
            "rope.freq_base": 50000.0, **kw}


@pytest.mark.parametrize("fmt", ["fp32", "int8", "int4", "bf16"])
def test_llama_file_reads_as_its_checkpoint(tmp_path, rng, fmt):
    hf_t = llama_tensors(rng, tied=False)
    hf, t = read_gguf_model(llama_file(tmp_path, "llama", hf_t, llama_meta(), fmt))
    assert hf == {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 40, "hidden_size": 64,
                  "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "head_dim": 16, "hidden_act": "silu", "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
                  "rope_theta": 50000.0, "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
                  "tie_word_embeddings": False}
    assert set(t) == set(hf_t)
    for name, want in hf_t.items():
        got = t[name]
        if want.ndim == 2 and fmt != "fp32":
            assert isinstance(got, QuantizedMatrix) and got.shape == want.T.shape, name
            assert np.array_equal(got.data, quantize_matrix(want.T, fmt).data), name     # Q/K rows back in HF order
        else:
            assert got.dtype == np.float32 and np.array_equal(got, want), name


def test_qwen2_is_not_permuted_and_has_qkv_biases(tmp_path, rng):
    hf_t = llama_tensors(rng, heads=4, kv=1, qkv_bias=True)
    meta = llama_meta(kv=1, **{"rope.freq_base": 1e6})
    hf, t = read_gguf_model(llama_file(tmp_path, "qwen2", hf_t, meta, "int8", permute=False))
    assert (hf["model_type"], hf["architectures"], hf["num_key_value_heads"]) == ("qwen2", ["Qwen2ForCausalLM"], 1)
    assert hf["tie_word_embeddings"] and hf["use_sliding_window"] is False and "attention_bias" not in hf
    for name, want in hf_t.items():
        got = t[name]
        assert np.array_equal(got.data if want.ndim == 2 else got, quantize_matrix(want.T, "int8").data
                              if want.ndim == 2 else want), name
    missing = llama_file(tmp_path, "qwen2", hf_t, meta, drop=("model.layers.1.self_attn.k_proj.bias",))
    with pytest.raises(ValueError, match=r"lacks tensor 'blk.1.attn_k.bias'"):
        read_gguf_model(missing)


def test_the_permutation_on_a_known_matrix(tmp_path):
    """Q's rows numbered: the file holds them in the converter's order, the reader gives them back."""
    hf_t = llama_tensors(np.random.default_rng(0), L=1, d=32, heads=2, kv=1, ff=32)
    q = np.repeat(np.arange(32, dtype=np.float32)[:, None], 32, axis=1)      # row r is all r
    hf_t["model.layers.0.self_attn.q_proj.weight"] = q
    path = llama_file(tmp_path, "llama", hf_t, llama_meta(L=1, d=32, heads=2, kv=1, ff=32))
    stored = GGUFFile(path).read("blk.0.attn_q.weight")[:, 0]
    # head 0: rows 0, 8, 1, 9, ... (pairs (i, i + d_k/2) made adjacent); head 1 likewise from 16
    assert stored.tolist() == [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,
                               16, 24, 17, 25, 18, 26, 19, 27, 20, 28, 21, 29, 22, 30, 23, 31]
    _, t = read_gguf_model(path)
    assert np.array_equal(t["model.layers.0.self_attn.q_proj.weight"], q)


def test_llama_biases_and_rope_scaling(tmp_path, rng):
    hf_t = llama_tensors(rng, L=1, qkv_bias=True)
    hf_t["model.layers.0.self_attn.o_proj.bias"] = rng.standard_normal(64).astype(np.float32)
    meta = llama_meta(L=1, **{"rope.scaling.type": "linear", "rope.scaling.factor": 2.0})
    hf, t = read_gguf_model(llama_file(tmp_path, "llama", hf_t, meta))
    assert hf["attention_bias"] and not hf["mlp_bias"] and hf["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    for n in ("q_proj", "k_proj", "v_proj", "o_proj"):      # the biases of Q and K un-permuted too
        assert np.array_equal(t[f"model.layers.0.self_attn.{n}.bias"], hf_t[f"model.layers.0.self_attn.{n}.bias"])
    partial = llama_file(tmp_path, "llama", hf_t, meta, drop=("model.layers.0.self_attn.o_proj.bias",))
    with pytest.raises(ValueError, match="'blk.0.attn_q.bias' is present but 'blk.0.attn_output.bias' is not"):
        read_gguf_model(partial)


def test_the_configs_load(tmp_path, rng):
    from tblock.models.llama import LlamaConfig
    hf_t = llama_tensors(rng, L=1)
    hf, _ = read_gguf_model(llama_file(tmp_path, "llama", hf_t, llama_meta(L=1)))
    cfg = LlamaConfig.from_hf(hf)
    assert (cfg.kv_heads, cfg.rope_theta, cfg.tie_word_embeddings, cfg.vocab_size) == (2, 50000.0, True, 40)


def gpt2_file(tmp_path, rng, fmt="fp32", L=2, d=64, ff=128, vocab=50, n_pos=16, tokens=None, **meta_kw):
    """(path, HF GPT-2 tensors): Conv1D weights (in, out) stored transposed, as the converter does."""
    shapes = {"wte.weight": (vocab, d), "wpe.weight": (n_pos, d), "ln_f.weight": (d,), "ln_f.bias": (d,)}
    for i in range(L):
        p = f"h.{i}."
        shapes.update({p + "ln_1.weight": (d,), p + "ln_1.bias": (d,), p + "attn.c_attn.weight": (d, 3 * d),
                       p + "attn.c_attn.bias": (3 * d,), p + "attn.c_proj.weight": (d, d),
                       p + "attn.c_proj.bias": (d,), p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
                       p + "mlp.c_fc.weight": (d, ff), p + "mlp.c_fc.bias": (ff,), p + "mlp.c_proj.weight": (ff, d),
                       p + "mlp.c_proj.bias": (d,)})
    hf_t = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    names = {"wte": "token_embd", "wpe": "position_embd", "ln_f": "output_norm", "ln_1": "attn_norm",
             "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up",
             "mlp.c_proj": "ffn_down"}
    ts = []
    for n, w in hf_t.items():
        parts = n.split(".")
        blk = parts[0] == "h"
        base = names[".".join(parts[2:-1]) if blk else parts[0]]
        gname = (f"blk.{parts[1]}." if blk else "") + f"{base}.{parts[-1]}"
        stored = w.T if (blk and w.ndim == 2) else w                  # Conv1D (in, out) -> (out, in) rows
        if stored.ndim == 2 and fmt != "fp32" and blk:
            ts.append(tensor(gname, list(reversed(stored.shape)), {"int8": Q8_0, "int4": Q4_0}[fmt],
                             quantize_matrix(w, fmt).data.tobytes()))
        else:
            ts.append(tensor(gname, list(reversed(stored.shape)), F32, f32(stored)))
    meta = {"block_count": L, "context_length": n_pos, "embedding_length": d, "feed_forward_length": ff,
            "attention.head_count": 4, "attention.layer_norm_epsilon": 1e-5, **meta_kw}
    kvs = [("general.architecture", "str", "gpt2"), ("tokenizer.ggml.tokens", "arr:str",
                                                      tokens or [str(i) for i in range(vocab)])]
    kvs += [(f"gpt2.{k}", "f32" if isinstance(v, float) else "u32", v) for k, v in meta.items()]
    return write(tmp_path, gguf_bytes(kvs, ts), f"gpt2-{fmt}.gguf"), hf_t


@pytest.mark.parametrize("fmt", ["fp32", "int8"])
def test_gpt2_file_reads_as_its_checkpoint(tmp_path, rng, fmt):
    from tblock.models.gpt2 import GPT2Config
    path, hf_t = gpt2_file(tmp_path, rng, fmt)
    hf, t = read_gguf_model(path)
    assert GPT2Config.from_hf(hf) == GPT2Config(vocab_size=50, n_positions=16, n_embd=64, n_layer=2, n_head=4,
                                                n_inner=128, layer_norm_epsilon=1e-5)
    assert set(t) == set(hf_t)
    for name, want in hf_t.items():
        got = t[name]
        if isinstance(got, QuantizedMatrix):                           # W itself: Conv1D's (in, out)
            assert got.shape == want.shape and np.array_equal(got.data, quantize_matrix(want, fmt).data), name
        else:
            assert np.array_equal(got, want), name
    w_q, w_k, w_v = split_outputs(t["h.0.attn.c_attn.weight"], [64, 64, 64])
    W = hf_t["h.0.attn.c_attn.weight"]
    for part, cols in ((w_q, W[:, :64]), (w_k, W[:, 64:128]), (w_v, W[:, 128:])):
        want = quantize_matrix(cols, fmt).data if fmt != "fp32" else cols
        assert np.array_equal(part.data if fmt != "fp32" else part, want)


# ----------------------------------------------------------------------------- models refused

def test_models_refused(tmp_path, rng):
    hf_t = llama_tensors(rng, L=1)

    def refuse(match, meta=None, arch="llama", **kw):
        path = llama_file(tmp_path, arch, hf_t, meta or llama_meta(L=1), **kw)
        with pytest.raises(ValueError, match=match) as e:
            read_gguf_model(path)
        assert str(e.value).startswith(str(path))

    refuse(r"general.architecture must be one of \('gpt2', 'llama', 'qwen2'\), got 'falcon'", arch="falcon")
    refuse(r"llama.block_count is 1000000, but the file holds only 11 tensors", llama_meta(L=10**6))
    refuse(r"metadata 'llama.feed_forward_length' is missing", {k: v for k, v in llama_meta(L=1).items()
                                                                if k != "feed_forward_length"})
    refuse(r"tensor 'blk.0.ffn_gate.weight' has shape \(96, 64\).*metadata makes it \(128, 64\)",
           llama_meta(L=1, ff=128))
    refuse(r"tensor 'token_embd.weight' has shape \(40, 64\).*\(40, 32\)", llama_meta(L=1, d=32, heads=2, kv=1))
    refuse(r"lacks tensor 'blk.0.attn_v.weight'", drop=("model.layers.0.self_attn.v_proj.weight",))
    refuse(r"unexpected tensor 'rope_freqs.weight': llama3-style",
           extra=[tensor("rope_freqs.weight", (8,), F32, f32(np.ones(8)))])
    refuse(r"unexpected tensor 'blk.1.attn_q.weight'", extra=[tensor("blk.1.attn_q.weight", (64, 64), F32,
                                                                     f32(np.ones((64, 64))))])
    refuse(r"head_count_kv \(3\) must divide head_count \(4\)", llama_meta(L=1, kv=3))
    refuse(r"'llama.vocab_size' is 41, but 'token_embd.weight' has 40 rows", llama_meta(L=1, vocab_size=41))
    refuse(r"rope.dimension_count is 8, but the heads are 16 wide", llama_meta(L=1, **{"rope.dimension_count": 8}))
    refuse(r"'llama.attention.layer_norm_rms_epsilon' must be a positive finite number",
           llama_meta(L=1, **{"attention.layer_norm_rms_epsilon": -1.0}))
    refuse(r"'llama.embedding_length' must be a positive integer, got 'x'", llama_meta(L=1, embedding_length="x"))
    path, _ = gpt2_file(tmp_path, rng, vocab_size=51)
    with pytest.raises(ValueError, match="'gpt2.vocab_size' is 51"):
        read_gguf_model(path)


def test_an_unsupported_type_is_named(tmp_path, rng):
    hf_t = llama_tensors(rng, L=1)
    q4_1 = tensor("blk.0.ffn_up.weight", (64, 96), 3, bytes(96 * 2 * 20))       # 2 blocks of 20 bytes a row
    path = llama_file(tmp_path, "llama", hf_t, llama_meta(L=1), drop=("model.layers.0.mlp.up_proj.weight",),
                      extra=[q4_1])
    with pytest.raises(ValueError, match=r"m.gguf: tensor 'blk.0.ffn_up.weight' is Q4_1, a type tblock does not read"):
        read_gguf_model(path)


def test_token_list_must_match(tmp_path, rng):
    path, _ = gpt2_file(tmp_path, rng, tokens=[str(i) for i in range(49)])
    with pytest.raises(ValueError, match=r"tokenizer.ggml.tokens' must list one token per row of 'token_embd.weight' "
                                         r"\(50\), got 49 tokens"):
        read_gguf_model(path)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_damaged_bytes_are_refused_or_read(tmp_path_factory, data):
    """Any few bytes of a valid model file overwritten: the file reads, or a ValueError names
    it; never another exception (an IndexError, an OverflowError, a MemoryError)."""
    tmp = tmp_path_factory.mktemp("fuzz")
    hf_t = llama_tensors(np.random.default_rng(1), L=1, d=32, heads=2, kv=1, ff=32, vocab=8)
    good = llama_file(tmp, "llama", hf_t, llama_meta(L=1, d=32, heads=2, kv=1, ff=32), "int8")
    raw = bytearray(good.read_bytes())
    header = GGUFFile(good).data_start          # most damage goes to the header, some to the data
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.one_of(st.integers(0, header), st.integers(0, len(raw) - 1)))
        raw[at:at + 8] = data.draw(st.binary(min_size=1, max_size=8))[:len(raw) - at]
    path = write(tmp, bytes(raw), "fuzz.gguf")
    try:
        read_gguf_model(path)
    except ValueError as e:
        assert str(e).startswith(str(path))


@pytest.mark.parametrize("fmt", ["fp32", "int8", "int4", "bf16"])
def test_load_keeps_the_files_formats(tmp_path, rng, fmt):
    """tblock.load(file): a Llama whose stored blocks are the file's bytes, computing what the
    safetensors weights quantized the same way compute."""
    import tblock
    hf_t = llama_tensors(rng, tied=False)
    model = tblock.load(llama_file(tmp_path, "llama", hf_t, llama_meta(), fmt))
    assert isinstance(model, tblock.Llama) and (model.weight_format, model.head_format) == (fmt, fmt)
    if fmt != "fp32":
        assert np.array_equal(model.blocks[1].w_k.data, quantize_matrix(hf_t["model.layers.1.self_attn.k_proj.weight"].T,
                                                                        fmt).data)
    hf, _ = read_gguf_model(tmp_path / "m.gguf")
    from tblock.models.llama import Llama, LlamaConfig
    want = Llama.from_tensors(LlamaConfig.from_hf(hf), hf_t, weights=fmt, head_weights=fmt)
    ids = np.array([3, 1, 4, 1, 5])
    np.testing.assert_array_equal(model(ids, backend="numpy"), want(ids, backend="numpy"))


def test_load_refuses_mixed_formats_and_float64_on_stored_blocks(tmp_path, rng):
    import tblock
    hf_t = llama_tensors(rng)
    q8 = quantize_matrix(hf_t["model.layers.0.mlp.up_proj.weight"].T, "int8").data.tobytes()
    path = llama_file(tmp_path, "llama", hf_t, llama_meta(), "int4", drop=("model.layers.0.mlp.up_proj.weight",),
                      extra=[tensor("blk.0.ffn_up.weight", [64, 96], Q8_0, q8)])
    with pytest.raises(ValueError, match=r"m.gguf: the blocks' matrices mix formats \(.*int4.*int8|int8.*int4"):
        tblock.load(path)
    path = llama_file(tmp_path, "llama", hf_t, llama_meta(), "int8", name="q8.gguf")
    with pytest.raises(ValueError, match="q8.gguf: its blocks are stored as int8, which computes in float32"):
        tblock.load(path, dtype=np.float64)
    with pytest.raises(ValueError, match="block 0 is stored as int8 .* not int4"):
        tblock.load(path, weights="int4")
