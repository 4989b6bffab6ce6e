"""The serialised form of a compiled trie: a versioned, checksummed binary blob.

Layout (little-endian):

| offset | bytes | field |
| --- | --- | --- |
| 0 | 8 | magic `b"TOOLTRIE"` |
| 8 | 2 | format version (`FORMAT_VERSION`) |
| 10 | 2 | flags (0) |
| 12 | 32 | tokenizer fingerprint (raw sha256) |
| 44 | 4 x 7 | n_nodes, n_edges, n_pointers, sep_token, stop_token, device_image_len, names_len |
| 72 | device_image_len | the device image (`tooltrie.grammar.trie`), i.e. all trie arrays |
| ... | 4 x n_pointers | byte length of every name, pointer order |
| ... | names_len | the names, UTF-8, concatenated |
| end - 32 | 32 | sha256 of every byte before it |
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from tooltrie.grammar.errors import TrieFormatError
from tooltrie.grammar.trie import DEVICE_LAYOUT_VERSION, DEVICE_MAGIC, CompiledTrie, _align16

MAGIC = b"TOOLTRIE"
FORMAT_VERSION = 1
_HEAD = struct.Struct("<8sHH32s7I")
_DIGEST = 32


def dump_trie(trie: CompiledTrie) -> bytes:
    """The blob of `trie` (see the module docstring)."""
    image = trie.device_image()
    encoded = [n.encode() for n in trie.names]
    lengths = np.fromiter(map(len, encoded), dtype="<u4", count=len(encoded)).tobytes()
    names = b"".join(encoded)
    head = _HEAD.pack(
        MAGIC,
        FORMAT_VERSION,
        0,
        bytes.fromhex(trie.tokenizer_fingerprint),
        trie.n_nodes,
        trie.n_edges,
        trie.n_pointers,
        trie.sep_token,
        trie.stop_token,
        len(image),
        len(names),
    )
    body = b"".join([head, image, lengths, names])
    return body + hashlib.sha256(body).digest()


def load_trie(blob: bytes, *, expected_fingerprint: str | None = None) -> CompiledTrie:
    """Parse and verify a blob; `TrieFormatError` says what is wrong (corrupt, version, tokenizer)."""
    blob = bytes(blob)
    if len(blob) < _HEAD.size + _DIGEST or blob[:8] != MAGIC:
        raise TrieFormatError(f"not a tooltrie trie blob ({len(blob)} bytes, starts {blob[:8]!r}; expected {MAGIC!r})")
    body, digest = blob[:-_DIGEST], blob[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise TrieFormatError(
            "trie blob checksum mismatch: the blob is corrupt or truncated; fetch or compile it again"
        )
    _magic, version, _flags, fp, n_nodes, n_edges, n_pointers, sep, stop, image_len, names_len = _HEAD.unpack_from(body)
    if version != FORMAT_VERSION:
        raise TrieFormatError(
            f"trie blob format version {version} is not supported (this build reads {FORMAT_VERSION})"
        )
    fingerprint = fp.hex()
    if expected_fingerprint is not None and fingerprint != expected_fingerprint:
        raise TrieFormatError(
            f"trie was compiled for tokenizer {fingerprint[:16]}..., not the expected {expected_fingerprint[:16]}...; "
            "recompile the catalog for this tokenizer"
        )
    expected_len = _HEAD.size + image_len + 4 * n_pointers + names_len
    if len(body) != expected_len:
        raise TrieFormatError(f"trie blob body is {len(body)} bytes; its header implies {expected_len}")
    trie_arrays = _parse_image(body[_HEAD.size : _HEAD.size + image_len], n_nodes, n_edges, n_pointers)
    at = _HEAD.size + image_len
    lengths = np.frombuffer(body, dtype="<u4", count=n_pointers, offset=at)
    raw = body[at + 4 * n_pointers :]
    if int(lengths.sum()) != names_len:
        raise TrieFormatError("trie blob name lengths do not add up to the names section")
    ends = np.cumsum(lengths).tolist()
    names = tuple(raw[e - n : e].decode() for e, n in zip(ends, lengths.tolist(), strict=True))
    trie = CompiledTrie(**trie_arrays, names=names, sep_token=sep, stop_token=stop, tokenizer_fingerprint=fingerprint)
    _validate(trie)
    return trie


def _parse_image(image: bytes, n_nodes: int, n_edges: int, n_pointers: int) -> dict[str, np.ndarray]:
    head = struct.unpack_from("<8I", image)
    if head[0] != DEVICE_MAGIC or head[1] != DEVICE_LAYOUT_VERSION or head[2:5] != (n_nodes, n_edges, n_pointers):
        raise TrieFormatError(f"trie device image header {head[:5]} does not match the blob header")
    at = 32

    def take(count: int, width: int = 1) -> np.ndarray:
        nonlocal at
        arr = np.frombuffer(image, dtype="<i4", count=count * width, offset=at).astype(np.int32)
        at += _align16(4 * count * width)
        return arr

    starts, terminal = take(n_nodes + 3), take(n_nodes + 2)
    edges = take(n_edges, 4).reshape(n_edges, 4)
    if at != len(image):
        raise TrieFormatError(f"trie device image is {len(image)} bytes; its counts imply {at}")
    return {
        "node_edge_start": starts,
        "node_terminal": terminal,
        "edge_token": np.ascontiguousarray(edges[:, 0]),
        "edge_child": np.ascontiguousarray(edges[:, 1]),
        "edge_lo": np.ascontiguousarray(edges[:, 2]),
        "edge_hi": np.ascontiguousarray(edges[:, 3]),
    }


def _validate(trie: CompiledTrie) -> None:
    """Structural checks, so a blob that passed the checksum but was written wrong still fails loudly."""
    s = trie.node_edge_start
    problems = []
    if s[0] != 0 or s[-1] != trie.n_edges or (np.diff(s) < 0).any():
        problems.append("node edge ranges are not monotonic over [0, n_edges]")
    if ((trie.edge_child < 1) | (trie.edge_child > trie.n_nodes + 1)).any():
        problems.append("an edge points outside the nodes")
    if ((trie.edge_lo < 0) | (trie.edge_lo >= trie.edge_hi) | (trie.edge_hi > trie.n_pointers)).any():
        problems.append("an edge has an empty or out-of-range pointer range")
    if sorted(trie.node_terminal[trie.node_terminal >= 0].tolist()) != list(range(trie.n_pointers)):
        problems.append("terminals do not cover every pointer exactly once")
    if problems:
        raise TrieFormatError("trie blob is inconsistent: " + "; ".join(problems))
