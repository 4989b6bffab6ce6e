from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

from tooltrie.grammar import CompiledTrie, GrammarState, TrieFormatError, compile_catalog
from tooltrie.grammar.serialize import FORMAT_VERSION, MAGIC

_ARRAYS = ("node_edge_start", "node_terminal", "edge_token", "edge_child", "edge_lo", "edge_hi")


@pytest.fixture(scope="module")
def trie(qwen3):
    return compile_catalog(["get_user", "get_user_by_id", "list_users", "日本.検索", "send🙂"], qwen3)


def test_round_trip(qwen3, trie):
    loaded = CompiledTrie.from_bytes(trie.to_bytes(), expected_fingerprint=qwen3.fingerprint)
    for name in _ARRAYS:
        assert np.array_equal(getattr(loaded, name), getattr(trie, name))
        assert getattr(loaded, name).dtype == np.int32
    assert loaded.names == trie.names
    assert (loaded.sep_token, loaded.stop_token) == (trie.sep_token, trie.stop_token)
    assert loaded.tokenizer_fingerprint == qwen3.fingerprint
    assert loaded.stats == trie.stats
    state = GrammarState(loaded, 1)
    for t in qwen3.encode("send🙂"):
        state.advance(t)
    assert loaded.names[state.advance(trie.stop_token)] == "send🙂"


def test_device_image_layout(trie):
    image = trie.device_image()
    header = struct.unpack_from("<8I", image)
    assert header[:7] == (0x54525454, 1, trie.n_nodes, trie.n_edges, trie.n_pointers, trie.sep_token, trie.stop_token)
    starts = np.frombuffer(image, "<i4", trie.n_nodes + 3, 32)
    assert np.array_equal(starts, trie.node_edge_start)
    a = 32 + -(-4 * (trie.n_nodes + 3) // 16) * 16
    b = a + -(-4 * (trie.n_nodes + 2) // 16) * 16
    assert np.array_equal(np.frombuffer(image, "<i4", trie.n_nodes + 2, a), trie.node_terminal)
    edges = np.frombuffer(image, "<i4", 4 * trie.n_edges, b).reshape(-1, 4)
    assert np.array_equal(edges[:, 0], trie.edge_token) and np.array_equal(edges[:, 3], trie.edge_hi)
    assert len(image) == b + 16 * trie.n_edges


def test_every_flipped_byte_is_detected(trie):
    blob = trie.to_bytes()
    for offset in range(0, len(blob), max(1, len(blob) // 97)):
        corrupt = bytearray(blob)
        corrupt[offset] ^= 0x41
        with pytest.raises(TrieFormatError):
            CompiledTrie.from_bytes(bytes(corrupt))


def test_truncated_and_foreign_blobs(trie):
    blob = trie.to_bytes()
    with pytest.raises(TrieFormatError, match="checksum"):
        CompiledTrie.from_bytes(blob[:-1])
    with pytest.raises(TrieFormatError, match="not a tooltrie"):
        CompiledTrie.from_bytes(b"hello")


def test_wrong_tokenizer(trie, smollm2):
    with pytest.raises(TrieFormatError, match="recompile"):
        CompiledTrie.from_bytes(trie.to_bytes(), expected_fingerprint=smollm2.fingerprint)


def test_unknown_version_with_valid_checksum(trie):
    body = bytearray(trie.to_bytes()[:-32])
    assert body[:8] == MAGIC
    struct.pack_into("<H", body, 8, FORMAT_VERSION + 1)
    with pytest.raises(TrieFormatError, match="version"):
        CompiledTrie.from_bytes(bytes(body) + hashlib.sha256(body).digest())


def test_inconsistent_arrays_with_valid_checksum(trie):
    broken = CompiledTrie(
        **{n: getattr(trie, n).copy() for n in _ARRAYS},
        names=trie.names,
        sep_token=trie.sep_token,
        stop_token=trie.stop_token,
        tokenizer_fingerprint=trie.tokenizer_fingerprint,
    )
    broken.edge_hi[0] = broken.edge_lo[0]
    with pytest.raises(TrieFormatError, match="inconsistent"):
        CompiledTrie.from_bytes(broken.to_bytes())
