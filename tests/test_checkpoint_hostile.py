"""Checkpoints made by a careless or a hostile hand, loaded as a user would (issue 31).

Every path a loader opens must stay inside the checkpoint's folder, symlinks included; every
size in config.json is checked against the files before anything is allocated from it; a
malformed safetensors file is a ValueError naming the file and what is wrong, and
``tblock generate`` says so in one line and exits 2.  The files are test_gpt2's small
checkpoints, written with safetensors' own writer and then damaged byte by byte.
"""

import json
import os
import struct
import subprocess

import numpy as np
import pytest
from conftest import proc
from test_gpt2 import SMALL, hf_config, random_tensors, write_checkpoint

from tblock import GPT2
from tblock.cli import main as cli_main


@pytest.fixture(scope="module")
def tensors():
    return random_tensors(np.random.default_rng(31), 101, 24, 32, 2)


@pytest.fixture
def ckpt(tmp_path, tensors):
    root = tmp_path / "ckpt"
    write_checkpoint(root, tensors, hf_config(**SMALL))
    return root


def read_safetensors(path):
    """(header dict, the data bytes) of a safetensors file."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_safetensors(path, header, data, length=None):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)


# ----------------------------------------------------------------------------- paths


@pytest.fixture
def outside(tmp_path, tensors):
    """A complete, valid checkpoint in a sibling folder: following a path there would load."""
    other = tmp_path / "other"
    write_checkpoint(other, tensors, hf_config(**SMALL))
    return other / "model.safetensors"


def sharded_to(root, file):
    """root: config.json and an index naming ``file`` for every tensor."""
    root.mkdir()
    (root / "config.json").write_text(json.dumps(hf_config(**SMALL)))
    names = read_safetensors(outside_file(root))[0]
    names.pop("__metadata__", None)
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: file for n in names}}))


def outside_file(root):
    return root.parent / "other" / "model.safetensors"


@pytest.mark.parametrize("entry", ["../other/model.safetensors", "ABSOLUTE", "sub/../../other/model.safetensors",
                                   "/proc/self/mem", "/etc/passwd"])
def test_an_index_cannot_name_a_file_outside_the_folder(tmp_path, outside, entry):
    root = tmp_path / "ckpt"
    entry = str(outside) if entry == "ABSOLUTE" else entry
    sharded_to(root, entry)
    with pytest.raises(ValueError, match="model.safetensors.index.json: tensor '.*'s file is") as e:
        GPT2.from_pretrained(root)
    assert repr(entry) in str(e.value)


def test_an_index_cannot_reach_outside_through_a_symlink(tmp_path, outside):
    root = tmp_path / "ckpt"
    sharded_to(root, "shard.safetensors")
    (root / "shard.safetensors").symlink_to(outside)
    with pytest.raises(ValueError, match=r"index\.json: tensor .* 'shard\.safetensors', which leads outside"):
        GPT2.from_pretrained(root)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "model.safetensors.index.json"])
def test_a_symlinked_file_cannot_lead_outside(ckpt, tmp_path, outside, name):
    target = tmp_path / "elsewhere" / name
    target.parent.mkdir()
    if name == "model.safetensors.index.json":
        names = [n for n in read_safetensors(outside)[0] if n != "__metadata__"]
        target.write_text(json.dumps({"weight_map": {n: "model.safetensors" for n in names}}))
    else:
        target.write_bytes((ckpt / name).read_bytes())
    (ckpt / name).unlink(missing_ok=True)
    (ckpt / name).symlink_to(target)
    with pytest.raises(ValueError, match=f"{name}.*leads outside the checkpoint's folder"):
        GPT2.from_pretrained(ckpt)


def test_symlinks_inside_the_folder_are_followed(ckpt, tmp_path):
    """A link that stays inside (as a Hugging Face cache's snapshot links do, within it) loads."""
    ids = np.arange(7)
    want = GPT2.from_pretrained(ckpt)(ids)
    (ckpt / "blobs").mkdir()
    (ckpt / "model.safetensors").rename(ckpt / "blobs" / "abc123")
    (ckpt / "model.safetensors").symlink_to(ckpt / "blobs" / "abc123")
    assert np.array_equal(GPT2.from_pretrained(ckpt)(ids), want)
    link = tmp_path / "link"
    link.symlink_to(ckpt)                       # the folder itself through a link
    assert np.array_equal(GPT2.from_pretrained(link)(ids), want)


# ----------------------------------------------------------------------------- config sizes


@pytest.mark.subprocess
def test_a_huge_n_layer_is_refused_before_anything_is_allocated(ckpt):
    """n_layer=10**9 in config.json over a two-block checkpoint: refused at once, in a child
    whose address space is held to what it needs (listing a billion blocks' names would not fit)."""
    hf = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**hf, "n_layer": 10**9}))
    p = subprocess.run(proc("load_bounded", ckpt, 512), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ValueError: ") and "n_layer=1000000000" in p.stdout, p.stdout


@pytest.mark.parametrize("key, value", [("vocab_size", 10**12), ("n_positions", 10**12), ("n_embd", 2**40),
                                        ("n_inner", 10**15)])
def test_config_sizes_are_checked_against_the_headers(ckpt, key, value):
    hf = json.loads((ckpt / "config.json").read_text())
    hf.update({key: value, "n_head": 1} if key == "n_embd" else {key: value})
    (ckpt / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor .* must have shape"):
        GPT2.from_pretrained(ckpt)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
def test_json_nested_too_deeply_is_a_value_error(ckpt, name):
    deep = "[" * 100_000 + "]" * 100_000
    (ckpt / name).write_text('{"n_layer": ' + deep + "}" if name == "config.json" else '{"weight_map": ' + deep + "}")
    with pytest.raises(ValueError, match=f"{name}: nested too deeply"):
        GPT2.from_pretrained(ckpt)


def test_a_safetensors_header_nested_too_deeply_is_a_value_error(ckpt):
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    (ckpt / "model.safetensors").write_bytes(struct.pack("<Q", len(deep)) + deep)
    with pytest.raises(ValueError, match="model.safetensors: nested too deeply"):
        GPT2.from_pretrained(ckpt)


@pytest.mark.parametrize("value", [[[[1]]], {"a": 1}])
def test_a_config_value_of_the_wrong_kind_is_named(ckpt, value):
    hf = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**hf, "n_embd": value}))
    with pytest.raises(TypeError, match="config.json: n_embd must be a number, a string or a bool"):
        GPT2.from_pretrained(ckpt)


# ----------------------------------------------------------------------------- malformed files


def damage(path, how):
    """Rewrite the safetensors file at ``path`` with one defect."""
    header, data = read_safetensors(path)
    raw = path.read_bytes()
    names = [n for n in header if n != "__metadata__"]
    a = "transformer.ln_f.bias"                                     # (32,) float32
    b = next(n for n in names if n != a and header[n]["shape"] == [32])     # another of its size
    if how == "truncated data":
        path.write_bytes(raw[:len(raw) - 100])
    elif how == "truncated header":
        path.write_bytes(raw[:40])
    elif how == "shorter than 8 bytes":
        path.write_bytes(raw[:5])
    elif how == "huge header length":
        path.write_bytes(struct.pack("<Q", 2**62) + raw[8:])
    elif how == "header length past the end":
        path.write_bytes(struct.pack("<Q", len(raw)) + raw[8:])
    elif how == "overlapping offsets":
        header[b]["data_offsets"] = header[a]["data_offsets"]
        write_safetensors(path, header, data)
    elif how == "out-of-range offsets":
        start = len(data) - 64
        header[a]["data_offsets"] = [start + 128, start + 256]
        write_safetensors(path, header, data)
    elif how == "negative offsets":
        header[a]["data_offsets"] = [-128, 0]
        write_safetensors(path, header, data)
    elif how == "a hole in the data":
        write_safetensors(path, header, data + b"\0" * 64)
    elif how == "unknown dtype":
        header[a]["dtype"] = "F33"
        write_safetensors(path, header, data)
    elif how == "dtype of another width":
        header[a]["dtype"] = "F16"
        write_safetensors(path, header, data)
    elif how == "negative shape":
        header[a]["shape"] = [-32]
        write_safetensors(path, header, data)
    elif how == "not JSON":
        write_safetensors(path, {}, b"")
        path.write_bytes(struct.pack("<Q", 12) + b"\xff\xfe{garbage!!" + data)
    elif how == "not an object":
        write_safetensors(path, names, data)
    elif how == "entry not an object":
        header[a] = "F32"
        write_safetensors(path, header, data)


DEFECTS = {
    "truncated data": "pass the end of the file's .* bytes of data",
    "truncated header": "truncated: a header of",
    "shorter than 8 bytes": "too short for a safetensors file",
    "huge header length": "header length of 4611686018427387904 bytes, over the format's limit",
    "header length past the end": "truncated: a header of",
    "overlapping offsets": "tensors .* and .* overlap",
    "out-of-range offsets": "pass the end of the file's",
    "negative offsets": "data_offsets must be",
    "a hole in the data": "belong to no tensor",
    "unknown dtype": "unknown dtype 'F33'",
    "dtype of another width": "128 bytes for shape \\(32,\\) in F16",
    "negative shape": "shape must be a list of integers >= 0",
    "not JSON": "not valid JSON",
    "not an object": "the header must be a JSON object",
    "entry not an object": "must be an object with dtype, shape and data_offsets",
}


@pytest.mark.parametrize("how", DEFECTS)
def test_a_malformed_safetensors_file_is_a_value_error_naming_it(ckpt, how):
    damage(ckpt / "model.safetensors", how)
    with pytest.raises(ValueError, match=f"model\\.safetensors: .*{DEFECTS[how]}") as e:
        GPT2.from_pretrained(ckpt)
    assert type(e.value) is ValueError                  # not the safetensors package's error
    assert str(ckpt) in str(e.value)


@pytest.mark.parametrize("how", ["truncated data", "overlapping offsets", "unknown dtype"])
def test_a_malformed_shard_is_named(tmp_path, tensors, how):
    root = tmp_path / "sharded"
    write_checkpoint(root, tensors, hf_config(**SMALL), shards=3)
    shard = next(p for p in sorted(root.glob("*.safetensors"))
                 if "transformer.ln_f.bias" in read_safetensors(p)[0])
    damage(shard, how)
    with pytest.raises(ValueError, match=f"{shard.name}: .*{DEFECTS[how]}"):
        GPT2.from_pretrained(root)


def test_a_file_changed_after_its_header_was_read_is_named(ckpt):
    """Truncated between the header's check and the read: the read notices."""
    from tblock.models.checkpoint import Checkpoint
    c = Checkpoint(ckpt)
    entry = c.tensors["transformer.wte.weight"]
    with open(ckpt / "model.safetensors", "r+b") as f:
        f.truncate(entry.start + 10)
    with pytest.raises(ValueError, match=r"model\.safetensors: truncated while reading tensor 'transformer\.wte"):
        c.read("transformer.wte.weight", np.float32)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_file_is_a_value_error(ckpt):
    (ckpt / "model.safetensors").chmod(0)
    with pytest.raises(ValueError, match=r"model\.safetensors: cannot be read: Permission denied"):
        GPT2.from_pretrained(ckpt)


@pytest.mark.parametrize("how", ["truncated data", "huge header length", "overlapping offsets"])
def test_tblock_generate_says_what_is_wrong_in_one_line(ckpt, capsys, how):
    damage(ckpt / "model.safetensors", how)
    code = cli_main(["generate", str(ckpt), "--ids", "1", "2", "-n", "3"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("tblock generate: error: ") and err.count("\n") == 1, err
    assert "model.safetensors" in err


def test_tblock_generate_refuses_a_path_outside_in_one_line(tmp_path, outside, capsys):
    root = tmp_path / "ckpt"
    sharded_to(root, "../other/model.safetensors")
    code = cli_main(["generate", str(root), "--ids", "1", "-n", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "outside the checkpoint's folder" in err
