"""Read and write ``.safetensors`` files as numpy arrays, bf16 included."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from safetensors import safe_open

from decoder_service.models.bf16 import bf16_bits_to_float32

# dtypes numpy (and so safetensors' numpy API) can hold directly.
_NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16}


def read_header(path: Path) -> dict[str, dict]:
    """The JSON header: per tensor its dtype, shape and byte range (``__metadata__`` removed)."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of one file; bf16 widened to fp32, fp16/fp32 kept as stored."""
    path = Path(path)
    header = read_header(path)
    tensors: dict[str, np.ndarray] = {}
    plain = [name for name, info in header.items() if info["dtype"] in _NUMPY_DTYPES]
    with safe_open(str(path), framework="np") as f:
        for name in plain:
            tensors[name] = f.get_tensor(name)
    bf16 = [name for name, info in header.items() if info["dtype"] == "BF16"]
    if bf16:
        # safetensors' numpy API refuses BF16; map the file and widen the raw bits ourselves.
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
        raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size)
        for name in bf16:
            start, end = header[name]["data_offsets"]
            bits = raw[start:end].view(np.uint16).reshape(header[name]["shape"])
            tensors[name] = bf16_bits_to_float32(bits)
    unknown = sorted(set(header) - set(tensors))
    if unknown:
        raise ValueError(
            f"{path}: tensor {unknown[0]!r} has dtype {header[unknown[0]]['dtype']}; "
            "supported dtypes are BF16, F16 and F32"
        )
    return tensors


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """Write ``{name: (dtype, array)}`` with dtype in BF16 (array of uint16 bits), F16 or F32.

    Written by hand because the numpy API cannot tag uint16 bits as BF16.
    """
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, array) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format asks for an 8-byte aligned data section
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, array in tensors.values():
            f.write(np.ascontiguousarray(array).tobytes())
