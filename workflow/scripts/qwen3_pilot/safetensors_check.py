"""A safetensors file's header checked before anything reads its tensors: the file can come from outside (a hub
download, an export another run wrote), and a hostile header could make a reader allocate or read far more than
the file holds.

The format (huggingface/safetensors, "Format"): 8 bytes, a little-endian u64 N; N bytes of a UTF-8 JSON object
mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the byte buffer that
follows the header), with an optional "__metadata__" object of strings; then the byte buffer, which the tensors
must index entirely, without holes or overlaps. Only the header is read here (at most `max_header_bytes`);
torch-free.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

# Bytes per element of each dtype the format names.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
# The reference implementation refuses headers above 100 MB (safetensors' MAX_HEADER_SIZE); the same cap here.
MAX_HEADER_BYTES = 100_000_000
METADATA_KEY = "__metadata__"


class SafetensorsHeaderError(ValueError):
    pass


def check_safetensors(path: Path, max_header_bytes: int = MAX_HEADER_BYTES) -> dict[str, Any]:
    """Raises SafetensorsHeaderError naming `path` and what is wrong; returns {name: {dtype, shape, offsets}}
    and the data length when the header describes the file exactly."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise SafetensorsHeaderError(f"{path}: {size} bytes, shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", prefix)
        if length > max_header_bytes:
            raise SafetensorsHeaderError(f"{path}: header length {length} bytes is above the cap of {max_header_bytes}")
        if 8 + length > size:
            raise SafetensorsHeaderError(f"{path}: header length {length} bytes runs past the end of the "
                                         f"{size}-byte file")
        raw = handle.read(length)
    header = _parse(path, raw)
    data_length = size - 8 - length
    tensors = {name: _tensor(path, name, entry, data_length) for name, entry in header.items() if name != METADATA_KEY}
    _metadata(path, header.get(METADATA_KEY))
    _coverage(path, tensors, data_length)
    return {"tensors": tensors, "data_length": data_length}


def _parse(path: Path, raw: bytes) -> dict[str, Any]:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise SafetensorsHeaderError(f"{path}: the header names {key!r} twice")
            seen[key] = value
        return seen

    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SafetensorsHeaderError(f"{path}: the header is not UTF-8 JSON ({error})") from None
    if not isinstance(header, dict):
        raise SafetensorsHeaderError(f"{path}: the header is a JSON {type(header).__name__}, not an object")
    return header


def _tensor(path: Path, name: str, entry: Any, data_length: int) -> dict[str, Any]:
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise SafetensorsHeaderError(f"{where}: expected exactly dtype, shape and data_offsets, got {entry!r}"[:300])
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPE_BYTES:
        raise SafetensorsHeaderError(f"{where}: unknown dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)})")
    if not isinstance(shape, list) or not all(_natural(d) for d in shape):
        raise SafetensorsHeaderError(f"{where}: shape {shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_natural(o) for o in offsets)):
        raise SafetensorsHeaderError(f"{where}: data_offsets {offsets!r} is not [begin, end] in bytes")
    begin, end = offsets
    if not begin <= end <= data_length:
        raise SafetensorsHeaderError(f"{where}: data_offsets [{begin}, {end}] lie outside the {data_length} bytes "
                                     "of data")
    expected = math.prod(shape) * DTYPE_BYTES[dtype]
    if end - begin != expected:
        raise SafetensorsHeaderError(f"{where}: {end - begin} bytes of data for {dtype} {shape}, which takes "
                                     f"{expected}")
    return {"dtype": dtype, "shape": shape, "offsets": (begin, end)}


def _metadata(path: Path, metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsHeaderError(f"{path}: {METADATA_KEY} must map names to strings")


def _coverage(path: Path, tensors: dict[str, dict[str, Any]], data_length: int) -> None:
    """The tensors index the data buffer entirely: sorted by offset, each starts where the last ended."""
    position, previous = 0, None
    for name, tensor in sorted(tensors.items(), key=lambda item: item[1]["offsets"]):
        begin, end = tensor["offsets"]
        if begin < position:
            raise SafetensorsHeaderError(f"{path}: tensors {previous!r} and {name!r} overlap "
                                         f"(bytes {begin}..{position})")
        if begin > position:
            raise SafetensorsHeaderError(f"{path}: bytes {position}..{begin} of the data belong to no tensor")
        position, previous = end, name
    if position != data_length:
        raise SafetensorsHeaderError(f"{path}: bytes {position}..{data_length} of the data belong to no tensor")


def _natural(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
