"""Hostile and broken safetensors headers, each built by hand, refused before any tensor is read, by the check and
by both readers (fetch_weights' verify_safetensors, export_reload's read_tensors), naming the file and the fault."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from qwen3_pilot.safetensors_check import SafetensorsHeaderError, check_safetensors
from qwen3_pilot.stages.export_reload.hf_export import ExportError, read_tensors
from qwen3_pilot.stages.fetch_weights.weights import WeightsError, verify_safetensors

# Two float32 tensors of 2 and 3 elements: 8 + 12 bytes of data.
GOOD = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [3], "data_offsets": [8, 20]}}


def write(path, header, data=b"\0" * 20, length=None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def test_a_file_safetensors_wrote_passes_and_its_tensors_are_described(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"x": torch.zeros(2, 3), "y": torch.ones(4, dtype=torch.bfloat16)}, str(path), metadata={"k": "v"})
    checked = check_safetensors(path)
    assert checked["tensors"]["x"]["shape"] == [2, 3] and checked["tensors"]["y"]["dtype"] == "BF16"
    assert checked["data_length"] == 2 * 3 * 4 + 4 * 2
    assert check_safetensors(write(tmp_path / "hand.safetensors", GOOD))["data_length"] == 20


@pytest.mark.parametrize("header, data, length, fault", [
    (GOOD, b"\0" * 20, 10**6, "header length 1000000 bytes runs past the end of the"),
    (GOOD, b"\0" * 20, 2**40, "header length 1099511627776 bytes is above the cap of 100000000"),
    (b"{not json", b"", None, "the header is not UTF-8 JSON"),
    (b"\xff\xfe{}", b"", None, "the header is not UTF-8 JSON"),
    ([1, 2], b"", None, "the header is a JSON list, not an object"),
    (b'{"a": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}, "a": {}}', b"", None, "names 'a' twice"),
    ({**GOOD, "a": {**GOOD["a"], "dtype": "F128"}}, b"\0" * 20, None, "tensor 'a': unknown dtype 'F128'"),
    ({**GOOD, "a": {**GOOD["a"], "shape": [-2]}}, b"\0" * 20, None, "shape [-2] is not a list of non-negative"),
    ({**GOOD, "a": {**GOOD["a"], "shape": [2.0]}}, b"\0" * 20, None, "shape [2.0] is not a list"),
    ({**GOOD, "b": {**GOOD["b"], "data_offsets": [8, 2**62]}}, b"\0" * 20, None,
     "tensor 'b': data_offsets [8, 4611686018427387904] lie outside the 20 bytes of data"),
    ({**GOOD, "b": {**GOOD["b"], "data_offsets": [12, 8]}}, b"\0" * 20, None, "lie outside the 20 bytes"),
    ({**GOOD, "a": {**GOOD["a"], "shape": [1000, 1000]}}, b"\0" * 20, None,
     "tensor 'a': 8 bytes of data for F32 [1000, 1000], which takes 4000000"),
    ({"a": GOOD["a"], "b": {"dtype": "F32", "shape": [3], "data_offsets": [4, 16]}}, b"\0" * 20, None,
     "tensors 'a' and 'b' overlap (bytes 4..8)"),
    ({"a": GOOD["a"], "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}}, b"\0" * 20, None,
     "bytes 8..12 of the data belong to no tensor"),
    (GOOD, b"\0" * 28, None, "bytes 20..28 of the data belong to no tensor"),
    ({**GOOD, "a": {**GOOD["a"], "extra": 1}}, b"\0" * 20, None, "tensor 'a': expected exactly dtype, shape"),
    ({**GOOD, "__metadata__": {"k": 1}}, b"\0" * 20, None, "__metadata__ must map names to strings"),
], ids=["length_past_file", "length_above_cap", "not_json", "not_utf8", "not_object", "duplicate_name",
        "unknown_dtype", "negative_dim", "float_dim", "offsets_outside", "offsets_reversed", "bytes_not_shape",
        "overlap", "hole", "trailing_bytes", "extra_key", "bad_metadata"])
def test_each_hostile_header_is_refused_naming_the_file_and_the_fault(tmp_path, header, data, length, fault):
    path = write(tmp_path / "model.safetensors", header, data, length)
    with pytest.raises(SafetensorsHeaderError) as raised:
        check_safetensors(path)
    assert str(raised.value).startswith(f"{path}: ") and fault in str(raised.value), str(raised.value)


def test_a_file_shorter_than_the_length_prefix_is_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(SafetensorsHeaderError, match="2 bytes, shorter than the 8-byte header length"):
        check_safetensors(path)


def test_both_readers_refuse_a_hostile_file_before_reading_it(tmp_path):
    folder = tmp_path / "export"
    folder.mkdir()
    path = write(folder / "model.safetensors", {**GOOD, "a": {**GOOD["a"], "shape": [10**6]}})
    with pytest.raises(WeightsError, match=r"not a safe safetensors file: .*model.safetensors: tensor 'a': 8 bytes"):
        verify_safetensors(path)
    with pytest.raises(ExportError, match=r"not a safe safetensors file: .*model.safetensors: tensor 'a': 8 bytes"):
        read_tensors(folder)
