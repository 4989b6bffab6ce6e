"""The host's view of the grammar step's memory (control block, published output, error codes, decode attention
chunking, the tensor-core GEMM's layout) against the macros of the CUDA sources, and the trie's placement rule. No
GPU needed."""

from __future__ import annotations

import re

import numpy as np
import pytest

from decoder_service.engines.base import CHAIN_TOKENS
from decoder_service.engines.cuda import forward, gemm_cluster, persistent, step
from tests.decoder_service.engines.cuda.emulator import CUDA_DIR, FakeDriver, install_fake_driver
from tests.decoder_service.engines.cuda.synthetic_tries import random_catalog, trie_from_sequences


def _macros(name: str) -> dict[str, int]:
    text = (CUDA_DIR / name).read_text()
    return {k: int(v) for k, v in re.findall(r"^#define (\w+) (\d+)\b", text, re.M)}


def test_control_block_and_output_match_the_kernel_header() -> None:
    m = _macros("trie_step.cuh")
    for field, word in step.CTL.items():
        assert m[f"TT_CTL_{field.upper()}"] == word, field
    assert m["TT_CTL_WORDS"] == step.CTL_WORDS
    assert m["TT_K_MAX"] == step.K_MAX
    assert m["TT_MAX_NAME_TOKENS"] == step.MAX_NAME_TOKENS
    assert m["TT_OUT_HEADER"] == step.OUT_HEADER
    assert m["TRIE_HEAD_SLOTS"] == step.HEAD_SLOTS
    assert (m["TT_OUT_COUNT"], m["TT_OUT_FINISHED"], m["TT_OUT_ERROR"], m["TT_OUT_STEPS"]) == (
        step.OUT_COUNT,
        step.OUT_FINISHED,
        step.OUT_ERROR,
        step.OUT_STEPS,
    )
    assert m["TT_FLAG_FORCED_TAIL"] == step.FLAG_FORCED_TAIL
    assert (m["TT_FLAG_CHAINS"], m["TT_CHAIN_TOKENS"]) == (step.FLAG_CHAINS, CHAIN_TOKENS)
    assert _macros("gemv_stream.cuh")["GSTREAM_CHAIN_TOKENS"] == CHAIN_TOKENS
    assert re.search(rf"#define TT_NO_LOGIT {step.NO_LOGIT:#010x}\b", (CUDA_DIR / "trie_step.cuh").read_text())
    codes = {v for k, v in m.items() if k.startswith("TT_ERR_")}
    assert codes == set(step.ERRORS), "every device error code needs a message on the host"


def test_decode_attention_chunk_and_cluster_match_the_kernel() -> None:
    macros = _macros("attention_decode.cuh")
    assert (macros["ATTN_CHUNK"], macros["ATTN_CLUSTER"]) == (forward.ATTN_CHUNK, forward.ATTN_CLUSTER)
    assert macros["ATTN_MERGE_BATCH"] == persistent.ATTN_MERGE_BATCH
    text = (CUDA_DIR / "attention_decode.cuh").read_text()
    assert re.search(r"^#define ATTN_MERGE_SPLIT \(2 \* ATTN_MERGE_BATCH\)", text, re.M)
    assert persistent.ATTN_MERGE_SPLIT == 2 * persistent.ATTN_MERGE_BATCH


def test_tensor_core_gemm_layout_matches_the_kernel() -> None:
    macros = _macros("gemm.cuh")
    assert (macros["GMMA_TILES"] * 16, macros["GMMA_RED_PAD"]) == (forward.GEMM_MMA_ROWS, forward.GEMM_MMA_RED_PAD)
    # every row-group form the host launches, compiled with 8 * TILES * PARTS = rows (PARTS: 2, or 4 in the
    # sixteen-warp forms), and with as many warps as the host launches it on
    text = (CUDA_DIR / "gemm.cuh").read_text()
    for tokens in forward.GEMM_MMA_TOKENS:
        forms = [(forward.gemm_mma_row_kernel(tokens, rows), rows, 2) for rows in forward.GEMM_MMA_ROW_FORMS]
        forms.append((forward.gemm_mma_wide_kernel(tokens), forward.GEMM_MMA_ROWS, 4))
        for name, rows, parts in forms:
            body = re.search(
                rf"__launch_bounds__\((\d+), 1\)\s*{name}\(.*?\{{\s*gemm_mma<(\d+)(?:, false, (\d+)(?:, \w+, (\d+))?)?",
                text,
                re.S,
            )
            assert body, f"{name} is not in gemm.cuh"
            threads, staged = int(body[1]), int(body[2])
            tiles, compiled_parts = int(body[3] or macros["GMMA_TILES"]), int(body[4] or 2)
            assert (staged, 8 * tiles * compiled_parts, compiled_parts) == (tokens, rows, parts), name
            assert threads == parts * macros["GMMA_KSPLIT"] * 32, name  # a warp a (row part, K-quarter)
    assert macros["GMMA_KSPLIT"] == 4  # gemm_mma_shared's four K-quarter partials
    assert macros["GMMA_BATCH"] == forward.GEMM_MMA_BATCH  # gemm_mma_halves_shared's phases: whole batches
    # the hosts' gemm_mma_stride (gemm_mma_shared, gemm_mma_halves_shared, the cluster GEMM's quarter_stride)
    assert "gemm_mma_stride(int K) { return K + (96 - K % 64) % 64; }" in (CUDA_DIR / "gemm.cuh").read_text()
    for cols in range(32, 6145, 32):  # 32 more than a multiple of 64, the fewest columns added
        assert gemm_cluster.gemm_mma_stride(cols) % 64 == 32 and 0 <= gemm_cluster.gemm_mma_stride(cols) - cols < 64


def test_cluster_gemm_layout_matches_the_kernel() -> None:
    gemm, cluster = _macros("gemm.cuh"), _macros("gemm_cluster.cuh")
    assert gemm["GMMA_KSPLIT"] == gemm_cluster.CLUSTER_BLOCKS  # a block a K-quarter
    assert gemm["GMMA_TILES"] * 8 == gemm_cluster.UNIT_ROWS  # a warp's 32-row unit: 4 n8 tiles
    assert gemm["GMMA_TILES"] * 32 * 16 == gemm_cluster.STEP_BYTES  # a lane's 16-byte piece of each tile a step
    assert (cluster["GMMC_WARPS"], cluster["GMMC_MAX_DEPTH"]) == (gemm_cluster.WARPS, gemm_cluster.MAX_DEPTH)
    text = (CUDA_DIR / "gemm_cluster.cuh").read_text()
    kernels = re.findall(r"gemm_mma_cluster(\d)_bf16\(GEMM_CLUSTER_PARAMS\)", text)
    assert sorted(int(t) for t in kernels) == sorted(gemm_cluster.CLUSTER_TILES)


@pytest.mark.parametrize(
    ("max_chunks", "plain", "cluster"), [(1, 1, 8), (3, 3, 8), (8, 8, 8), (9, 9, 16), (24, 24, 24), (2048, 24, 24)]
)
def test_cluster_attention_grid_is_whole_clusters(max_chunks: int, plain: int, cluster: int) -> None:
    assert forward.attention_blocks_per_head(max_chunks) == plain
    assert forward.attention_blocks_per_head(max_chunks, cluster=True) == cluster


@pytest.mark.parametrize(
    ("max_chunks", "setting", "plain"), [(64, None, 24), (3, None, 12), (64, "96", 96), (64, "8", 8), (3, "96", 12)]
)
def test_chain_attention_grid(
    monkeypatch: pytest.MonkeyPatch, max_chunks: int, setting: str | None, plain: int
) -> None:
    """A chain's global-merge attention shares ATTN_CHAIN_BLOCKS (or the setting) out among its tokens, never more
    than CHAIN_TOKENS single-token grids; the cluster form keeps a single token's whole clusters."""
    if setting is None:
        monkeypatch.delenv("TOOLTRIE_CHAIN_ATTENTION_BLOCKS", raising=False)
    else:
        monkeypatch.setenv("TOOLTRIE_CHAIN_ATTENTION_BLOCKS", setting)
    assert forward.chain_attention_blocks(max_chunks, cluster=False) == plain
    assert forward.chain_attention_blocks(max_chunks, cluster=True) == forward.attention_blocks_per_head(
        max_chunks, cluster=True
    )


def test_chain_attention_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLTRIE_CHAIN_ATTENTION_BLOCKS", "0")
    with pytest.raises(ValueError, match="TOOLTRIE_CHAIN_ATTENTION_BLOCKS=0 is out of range: 1 to 96"):
        forward.chain_attention_blocks(64, cluster=False)


def test_control_init_words() -> None:
    words = step.ControlInit(position=41, k=3, max_steps=30, trie_ptr=0x1234_5678_9ABC, allowed_ptr=8, n_allowed=2)
    w = words.words()
    assert (w[step.CTL["pos"]], w[step.CTL["owed"]], w[step.CTL["maxsteps"]], w[step.CTL["nallowed"]]) == (41, 3, 30, 2)
    assert w[step.CTL["trie"] : step.CTL["trie"] + 2].view(np.uint64)[0] == 0x1234_5678_9ABC
    assert w[step.CTL["allowed"] : step.CTL["allowed"] + 2].view(np.uint64)[0] == 8
    assert (w[step.CTL["spent"] : step.CTL["spent"] + step.K_MAX] == -1).all()
    assert w[step.CTL["flags"]] == step.FLAG_FORCED_TAIL and w[step.CTL["forced"]] == 0
    unforced = step.ControlInit(position=0, k=1, max_steps=2, trie_ptr=0, forced_tail=False)
    assert unforced.words()[step.CTL["flags"]] == 0


@pytest.fixture
def fake_driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    return install_fake_driver(monkeypatch)


def test_trie_placement_follows_the_constant_bank(fake_driver: FakeDriver) -> None:
    from decoder_service.engines.cuda.driver import Stream
    from decoder_service.engines.cuda.trie_upload import DeviceTrie

    stream = Stream()
    small = trie_from_sequences([[100, 101], [100, 102], [103]], 1000, 1, 2)
    large = random_catalog(np.random.default_rng(0), 3000, 50_000, 1, 2, first_tokens=400, max_len=4)
    assert small.stats.fits_constant_bank and not large.stats.fits_constant_bank
    assert DeviceTrie(small, stream).constant and DeviceTrie(small, stream).global_ptr == 0
    big = DeviceTrie(large, stream)
    assert not big.constant and big.global_ptr == big.buffer.ptr
    assert not DeviceTrie(small, stream, "global").constant
    with pytest.raises(ValueError, match="over the 65536-byte constant bank"):
        DeviceTrie(large, stream, "constant")
    with pytest.raises(ValueError, match="accepted: auto, constant, global"):
        DeviceTrie(small, stream, "shared")  # type: ignore[arg-type]
