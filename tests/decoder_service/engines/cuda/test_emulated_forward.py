"""The runtime's launch lists, run on a numpy stand-in for the driver, against Hugging Face transformers.

No GPU needed: this checks argument order, pointer offsets, fused weight layouts, chunked prefill and the
host loop. The kernels' arithmetic itself is checked on the GPU (test_kernels_gpu.py)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING

import pytest

from tests.decoder_service.engines.cuda.emulator import FakeDriver, install_fake_driver
from tests.decoder_service.engines.cuda.hf_models import SHAPES, build_fp8_reference, build_reference, compare_greedy

if TYPE_CHECKING:  # imported at run time only once the fake driver is in place
    from decoder_service.engines.cuda.forward import CudaModel
    from decoder_service.models.config import ModelConfig

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture
def fake_driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    return install_fake_driver(monkeypatch)


# The ring depth's argument index in each streaming GEMV launch (cuda/gemv_stream.cuh: the last argument).
STREAM_DEPTH_ARG = {"gemv_stream_bf16": 10, "gemv_stream_swiglu_bf16": 9}


def tiny_qwen3_model(decode_kernel: str = "layers") -> CudaModel:
    """The tiny Qwen3 on the emulated H200, built under the current TOOLTRIE_* settings (with the layered decode step
    unless told otherwise: most tests here look at its launches)."""
    from decoder_service.engines.cuda.forward import CudaModel
    from decoder_service.engines.cuda.module import Module

    _, weights = build_reference(SHAPES["tiny-qwen3"], seed=7)
    return CudaModel(
        SHAPES["tiny-qwen3"], weights, Module(b"cubin"), max_context=64, max_prefill=8, decode_kernel=decode_kernel
    )


def mma16_launches(driver: FakeDriver) -> int:
    """Launches of the 16-token tensor-core GEMM, in any of its row-group forms or on sixteen warps."""
    from decoder_service.engines.cuda.forward import GEMM_MMA_ROW_FORMS, gemm_mma_row_kernel, gemm_mma_wide_kernel

    kernels = [gemm_mma_row_kernel(16, rows) for rows in GEMM_MMA_ROW_FORMS] + [gemm_mma_wide_kernel(16)]
    return sum(driver.launches.count(kernel) for kernel in kernels)


def prompt_of(cfg: ModelConfig, n: int) -> list[int]:
    """A prompt of n token ids spread over the vocabulary."""
    return [(3 * i * i + 11 * i + 5) % cfg.vocab_size for i in range(n)]


@pytest.mark.parametrize("decode_kernel", ["layers", "persistent"])
@pytest.mark.parametrize("shape", ["tiny-qwen3", "tiny-qwen2-hd128-untied", "tiny-llama-untied"])
def test_emulated_model_matches_transformers(fake_driver: FakeDriver, shape: str, decode_kernel: str) -> None:
    from decoder_service.engines.cuda.forward import CudaModel, decode_attention_kernel
    from decoder_service.engines.cuda.module import Module

    cfg = SHAPES[shape]
    attention = decode_attention_kernel(cfg.head_dim)  # head_dim 64 and 128 take the kernels compiled for them
    hf_model, weights = build_reference(cfg, seed=7)
    model = CudaModel(cfg, weights, Module(b"cubin"), max_context=64, max_prefill=8, decode_kernel=decode_kernel)
    prompt = prompt_of(cfg, 13)
    report = compare_greedy(model, hf_model, prompt, new_tokens=4)
    assert report["rel_err"] <= 1e-4, report
    assert report["token_mismatches"] == 0, report
    # 13 prompt tokens in chunks of 8 take two prefills, whose GEMMs run on the tensor cores, 16 tokens a block.
    assert mma16_launches(fake_driver) == 2 * 4 * cfg.num_layers
    assert fake_driver.launches.count("gemm_bf16") == 0
    steps = 3
    if decode_kernel == "layers":
        # Rows this short take one warp each, so every decode GEMV streams its weights through shared memory.
        assert fake_driver.launches.count("gemv_stream_bf16") == steps * (3 * cfg.num_layers + 1) + 2  # and heads
        assert fake_driver.launches.count("gemv_stream_swiglu_bf16") == steps * cfg.num_layers  # each gate|up
        assert fake_driver.launches.count(attention) == steps * cfg.num_layers
        assert fake_driver.launches.count("decode_persistent") == fake_driver.cooperative_launches == 0
    else:  # one launch a step runs every layer; only the heads (2 prefills, 3 steps) remain GEMV launches
        assert fake_driver.launches.count("decode_persistent") == fake_driver.cooperative_launches == steps
        assert fake_driver.launches.count("gemv_stream_bf16") == steps + 2
        assert fake_driver.launches.count("gemv_stream_swiglu_bf16") == 0
        assert not any(name.startswith("attention_decode") for name in fake_driver.launches)
    assert fake_driver.launches.count("gemv_bf16") == fake_driver.launches.count("gemv_swiglu_bf16") == 0
    assert model.length == 13 + steps


@pytest.mark.parametrize("shape", ["tiny-qwen3", "tiny-llama-untied"])
def test_emulated_fp8_model_matches_transformers_on_the_same_weights(fake_driver: FakeDriver, shape: str) -> None:
    """The FP8 weight format: every single-token GEMV reads e4m3 bytes and row scales (decoded here independently
    of the encoder), and the model agrees with transformers given the same quantized parameters."""
    from decoder_service.engines.cuda.forward import CudaModel
    from decoder_service.engines.cuda.module import Module

    cfg = SHAPES[shape]
    hf_model, weights = build_fp8_reference(cfg, seed=7)
    model = CudaModel(cfg, weights, Module(b"cubin"), max_context=64, max_prefill=8, weight_format="fp8")
    prompt = [(5 * i * i + 7 * i + 3) % cfg.vocab_size for i in range(11)]
    report = compare_greedy(model, hf_model, prompt, new_tokens=4)
    assert report["rel_err"] <= 1e-4, report
    assert report["token_mismatches"] == 0, report
    steps = 3
    assert fake_driver.launches.count("gemv_stream_fp8") == steps * 3 * cfg.num_layers
    assert fake_driver.launches.count("gemv_stream_swiglu_fp8") == steps * cfg.num_layers
    assert fake_driver.launches.count("gemv_stream_bf16") == steps + 2  # only the heads read bf16 rows
    assert fake_driver.launches.count("gemv_stream_swiglu_bf16") == 0


def test_fp8_format_refuses_weights_that_are_not_e4m3_rows(fake_driver: FakeDriver) -> None:
    from decoder_service.engines.cuda.forward import CudaModel
    from decoder_service.engines.cuda.module import Module

    cfg = SHAPES["tiny-qwen3"]
    _, weights = build_reference(cfg, seed=7)
    before = set(fake_driver.live)
    with pytest.raises(ValueError, match="layer 0 qkv: row 0 is not e4m3 times a power of two"):
        CudaModel(cfg, weights, Module(b"cubin"), max_context=64, max_prefill=8, weight_format="fp8")
    with pytest.raises(ValueError, match="unknown weight format 'int4'"):
        CudaModel(cfg, weights, Module(b"cubin"), max_context=64, max_prefill=8, weight_format="int4")
    assert fake_driver.live == before  # the weights uploaded before the refusal were freed


def test_long_prefill_runs_on_the_tensor_cores(fake_driver: FakeDriver) -> None:
    from decoder_service.engines.cuda.forward import CudaModel
    from decoder_service.engines.cuda.module import Module

    cfg = SHAPES["tiny-qwen3"]
    hf_model, weights = build_reference(cfg, seed=7)
    model = CudaModel(cfg, weights, Module(b"cubin"), max_context=128, max_prefill=128)
    prompt = [(5 * i * i + 7 * i + 3) % cfg.vocab_size for i in range(70)]
    report = compare_greedy(model, hf_model, prompt, new_tokens=2)
    assert report["rel_err"] <= 1e-4, report
    assert report["token_mismatches"] == 0, report
    assert mma16_launches(fake_driver) == 4 * cfg.num_layers
    assert fake_driver.launches.count("gemm_bf16") == 0


def test_gemm_cluster_takes_prefills_up_to_its_token_limit(
    fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With $TOOLTRIE_GEMM_CLUSTER_TOKENS=16 a prefill of at most 16 tokens takes the cluster GEMMs (the emulator
    checks their grid of whole clusters, ring depth and shared memory), the same answers; longer ones keep
    gemm_mma16_bf16."""
    from decoder_service.engines.cuda.forward import CudaModel
    from decoder_service.engines.cuda.gemm_cluster import CLUSTER_TOKENS_ENV
    from decoder_service.engines.cuda.module import Module

    monkeypatch.setenv(CLUSTER_TOKENS_ENV, "16")
    cfg = SHAPES["tiny-qwen3"]
    hf_model, weights = build_reference(cfg, seed=7)
    model = CudaModel(cfg, weights, Module(b"cubin"), max_context=64, max_prefill=32)
    report = compare_greedy(model, hf_model, prompt_of(cfg, 13), new_tokens=2)
    assert report["rel_err"] <= 1e-4, report
    assert report["token_mismatches"] == 0, report
    assert fake_driver.launches.count("gemm_mma_cluster1_bf16") == 4 * cfg.num_layers  # the 13-token prompt
    assert mma16_launches(fake_driver) == 0
    model.reset()
    model.prefill([7] * 20)
    assert mma16_launches(fake_driver) == 4 * cfg.num_layers


def test_gemm_halves_takes_short_prefills_of_rows_too_wide_for_16_tokens() -> None:
    """Rows 6,144 wide fit 8 tokens' hi and lo rows, 16 only one half of each K-quarter at a time: prefills of 17 to
    the token limit take gemm_mma16h_bf16, others gemm_mma8_bf16; rows that fit 16 tokens are unchanged."""
    from decoder_service.engines.cuda.forward import gemm_mma_halves_shared, gemm_mma_kernel

    assert gemm_mma_kernel(6144, 36) == ("gemm_mma8_bf16", 8, 2 * 8 * 6176 * 2 + 4 * 8 * 68 * 4)  # no limit given
    assert gemm_mma_kernel(6144, 36, 64) == ("gemm_mma16h_bf16", 16, gemm_mma_halves_shared(6144))
    assert gemm_mma_halves_shared(6144) == 2 * 16 * (4 * 24 * 32 + 32) * 2 + 4 * 16 * 68 * 4  # 24 steps a phase
    assert gemm_mma_kernel(6144, 65, 64)[0] == gemm_mma_kernel(6144, 16, 64)[0] == "gemm_mma8_bf16"
    assert gemm_mma_kernel(2048, 36, 64)[0] == "gemm_mma16_bf16"


@pytest.mark.parametrize(
    ("m", "n_out", "k_in", "kernel", "rows", "grid"),
    [
        (16, 4096, 2048, "gemm_mma16r32_bf16", 32, (1, 128, 1)),  # one token group: blocks to spare
        (16, 2048, 6144, "gemm_mma8r32_bf16", 32, (2, 64, 1)),
        (36, 2048, 2048, "gemm_mma16_bf16", 64, (3, 32, 1)),  # one group a block already
        (36, 4096, 2048, "gemm_mma16r128_bf16", 128, (3, 32, 1)),  # 64 groups on 44 blocks: two rounds
        (36, 12288, 2048, "gemm_mma16_bf16", 64, (3, 44, 1)),  # 5 rounds of 64 rows against 3 of 128
        (512, 12288, 2048, "gemm_mma16r128_bf16", 128, (32, 4, 1)),
        (512, 2048, 6144, "gemm_mma8r128_bf16", 128, (64, 2, 1)),
    ],
)
def test_gemm_row_groups_follow_the_grid(m: int, n_out: int, k_in: int, kernel: str, rows: int, grid: tuple) -> None:
    """On 132 SMs (an H100 or H200), these GEMMs of Qwen3-1.7B's projections take the row-group form that measured
    fastest on an H100 (docs/cuda-speed-notes.md #148): 32 rows where the 64-row grid leaves SMs idle, 128 where
    blocks take several groups each, 64 between; the shared memory is the form's. gemm_mma16h_bf16 keeps 64 rows."""
    from decoder_service.engines.cuda.forward import gemm_mma_halves_shared, gemm_mma_launch, gemm_mma_shared

    launch = gemm_mma_launch(k_in, m, n_out, 132, halves_tokens=128, warps=8)
    tokens = 16 if "mma16" in kernel else 8
    assert launch == (kernel, gemm_mma_shared(tokens, k_in, rows), grid, 256)
    halves = ("gemm_mma16h_bf16", gemm_mma_halves_shared(6144), (3, 32, 1), 256)
    assert gemm_mma_launch(6144, 36, 2048, 132, 128) == halves


def test_sixteen_warps_take_the_64_row_forms() -> None:
    """With 16 warps a block, the 64-row forms become their w forms on 512 threads, with the same grid and shared
    memory; the 32- and 128-row forms and gemm_mma16h_bf16 keep their eight warps."""
    from decoder_service.engines.cuda.forward import gemm_mma_launch

    for args in ((2048, 36, 2048, 132), (6144, 36, 2048, 132, 128), (2048, 36, 4096, 132), (2048, 16, 4096, 132)):
        eight, sixteen = gemm_mma_launch(*args, warps=8), gemm_mma_launch(*args, warps=16)
        assert eight is not None and sixteen is not None
        if eight.kernel == "gemm_mma16_bf16":
            assert sixteen == ("gemm_mma16w_bf16", eight.shared, eight.grid, 512)
        else:
            assert sixteen == eight


def prefill_launch_counts(driver: FakeDriver, kernels: Iterable[str]) -> dict[str, int]:
    """How often each of ``kernels`` is launched by an 8-token prefill of the tiny Qwen3 built under the current
    TOOLTRIE_* settings."""
    driver.launches.clear()
    tiny_qwen3_model().prefill(prompt_of(SHAPES["tiny-qwen3"], 8))
    return {k: driver.launches.count(k) for k in kernels}


def test_gemm_rows_setting_takes_one_row_group_form(fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """TOOLTRIE_GEMM_ROWS=32, 64 or 128 puts every prefill GEMM of the tiny Qwen3 (8-token chunks) on that form (on
    eight warps here: the next test covers sixteen)."""
    from decoder_service.engines.cuda.forward import GEMM_MMA_ROW_FORMS, gemm_mma_row_kernel

    layers = SHAPES["tiny-qwen3"].num_layers
    monkeypatch.setenv("TOOLTRIE_GEMM_WARPS", "8")
    kernels = [gemm_mma_row_kernel(16, r) for r in GEMM_MMA_ROW_FORMS]
    for rows in GEMM_MMA_ROW_FORMS:
        monkeypatch.setenv("TOOLTRIE_GEMM_ROWS", str(rows))
        want = {k: 4 * layers if k == gemm_mma_row_kernel(16, rows) else 0 for k in kernels}
        assert prefill_launch_counts(fake_driver, kernels) == want


def test_gemm_warps_setting_puts_the_64_row_groups_on_sixteen_warps(
    fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default and with TOOLTRIE_GEMM_WARPS=16, the 64-row groups launch every prefill GEMM of the tiny Qwen3 as
    gemm_mma16w_bf16 on 512 threads (the emulator checks the block); 8 keeps gemm_mma16_bf16."""
    layers = SHAPES["tiny-qwen3"].num_layers
    monkeypatch.setenv("TOOLTRIE_GEMM_ROWS", "64")
    kernels = ("gemm_mma16w_bf16", "gemm_mma16_bf16")
    for warps, kernel in ((None, kernels[0]), ("16", kernels[0]), ("8", kernels[1])):
        if warps is None:
            monkeypatch.delenv("TOOLTRIE_GEMM_WARPS", raising=False)
        else:
            monkeypatch.setenv("TOOLTRIE_GEMM_WARPS", warps)
        assert prefill_launch_counts(fake_driver, kernels) == {k: 4 * layers if k == kernel else 0 for k in kernels}


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TOOLTRIE_GEMV_STAGES", "99", "TOOLTRIE_GEMV_STAGES=99 is out of range"),
        ("TOOLTRIE_PREFILL_ATTENTION", "2", "TOOLTRIE_PREFILL_ATTENTION=2 is out of range"),
        ("TOOLTRIE_GEMM_ROWS", "48", r"TOOLTRIE_GEMM_ROWS=48: the row-group forms are \[32, 64, 128\]"),
        ("TOOLTRIE_GEMM_WARPS", "12", "TOOLTRIE_GEMM_WARPS=12: the tensor-core GEMMs run on 8 or 16 warps"),
    ],
)
def test_a_refused_setting_leaves_nothing_on_the_device(
    fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    """A setting read after the weights and buffers went up, refused: the error names it, and the half-built
    model frees every allocation it made."""
    monkeypatch.setenv(name, value)
    before = set(fake_driver.live)
    with pytest.raises(ValueError, match=message):
        tiny_qwen3_model()
    assert fake_driver.live == before


def test_inputs_the_tensor_cores_do_not_take_use_the_tiled_gemm(fake_driver: FakeDriver) -> None:
    """Rows 200 and 400 wide (not multiples of 32) take the tiled fp32 GEMM; the attention output (4 heads of 64)
    still takes the tensor cores."""
    from decoder_service.engines.cuda.forward import CudaModel
    from decoder_service.engines.cuda.module import Module

    cfg = dataclasses.replace(SHAPES["tiny-qwen3"], hidden_size=200, intermediate_size=400)
    hf_model, weights = build_reference(cfg, seed=7)
    model = CudaModel(cfg, weights, Module(b"cubin"), max_context=64, max_prefill=16)
    report = compare_greedy(model, hf_model, [(7 * i + 3) % cfg.vocab_size for i in range(13)], new_tokens=2)
    assert report["rel_err"] <= 1e-4, report
    assert report["token_mismatches"] == 0, report
    assert fake_driver.launches.count("gemm_bf16") == 3 * cfg.num_layers  # qkv, gate|up, down
    assert mma16_launches(fake_driver) == cfg.num_layers  # o


@pytest.mark.parametrize(
    ("k_in", "tokens", "shared"),
    [
        (64, 16, 2 * 16 * 96 * 2 + 4 * 16 * 68 * 4),
        (2048, 16, 2 * 16 * 2080 * 2 + 4 * 16 * 68 * 4),
        (6144, 8, 2 * 8 * 6176 * 2 + 4 * 8 * 68 * 4),
        (200, 0, 0),
        (16384, 0, 0),
    ],
)
def test_tensor_core_gemm_tokens_per_block(k_in: int, tokens: int, shared: int) -> None:
    """16 tokens a block where their hi and lo rows fit shared memory, else 8, else none (the tiled GEMM)."""
    from decoder_service.engines.cuda.forward import MAX_SHARED_PER_BLOCK, gemm_mma_shared, gemm_mma_tokens

    assert gemm_mma_tokens(k_in) == tokens
    if tokens:
        assert gemm_mma_shared(tokens, k_in) == shared <= MAX_SHARED_PER_BLOCK


def test_repeated_prefill_reuses_its_launch_list(fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second prefill of the same length at the same position launches the kept list, with the same result."""
    from decoder_service.engines.cuda.forward import PREFILL_LISTS_KEPT

    model = tiny_qwen3_model()
    builds = []
    build = model._build_parts
    monkeypatch.setattr(model, "_build_parts", lambda n, **kw: builds.append((n, kw["pos"])) or build(n, **kw))

    def answer(prompt: list[int]) -> tuple[list[float], int]:
        model.reset()
        model.prefill(prompt)
        return model.read_logits().tolist(), model.read_token()

    first = answer([5, 9, 2, 7, 1])
    other = answer([3, 3, 8, 1, 4, 6])
    again = answer([5, 9, 2, 7, 1])
    assert builds == [(5, 0), (6, 0)]  # the third prefill built nothing
    assert again == first and other != first
    for pos in range(PREFILL_LISTS_KEPT + 3):  # more shapes than are kept: the least recently used go
        model._prefill_launches(1, pos)
    assert len(model._prefill_lists) == PREFILL_LISTS_KEPT
    assert (1, 0) not in model._prefill_lists and (1, PREFILL_LISTS_KEPT + 2) in model._prefill_lists


def test_first_prefill_launches_each_layer_as_it_is_built(
    fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shape's first prefill puts each layer's kernels on the stream before it builds the next layer's launches,
    so the GPU runs the first layers while the host builds the rest; the kept list is the same launches."""
    model = tiny_qwen3_model()
    launched_before = []  # kernels launched when each layer's attention launch is built
    build = model._prefill_attention
    monkeypatch.setattr(
        model, "_prefill_attention", lambda i, *a: launched_before.append(len(fake_driver.launches)) or build(i, *a)
    )
    start = len(fake_driver.launches)
    model.prefill(prompt_of(model.config, 5))
    assert len(launched_before) == model.config.num_layers
    assert launched_before[0] > start  # the embedding went out before layer 0 was built
    assert all(b > a for a, b in itertools.pairwise(launched_before))
    kept = model._prefill_lists[(5, 0)]
    assert len(fake_driver.launches) - start == len(kept)


def test_model_rejects_wrong_weight_shape(fake_driver: FakeDriver) -> None:
    from decoder_service.engines.cuda.forward import CudaModel
    from decoder_service.engines.cuda.module import Module

    cfg = SHAPES["tiny-llama-untied"]
    _, weights = build_reference(cfg, seed=1)
    weights["model.layers.1.mlp.down_proj.weight"] = weights["model.layers.1.mlp.down_proj.weight"][:, :-8]
    with pytest.raises(ValueError, match=r"down_proj\.weight.*expected"):
        CudaModel(cfg, weights, Module(b"cubin"), max_context=32, max_prefill=8)


@pytest.mark.parametrize("decode_kernel", ["layers", "persistent"])
def test_model_frees_all_it_allocated(fake_driver: FakeDriver, decode_kernel: str) -> None:
    before = set(fake_driver.live)
    model = tiny_qwen3_model(decode_kernel)
    model.prefill([5, 6, 7])
    model.decode()
    assert fake_driver.live - before, "the model holds device memory while alive"
    model.free()
    assert fake_driver.live == before, f"{len(fake_driver.live - before)} device buffers outlive the model"


@pytest.mark.parametrize(
    ("shape", "weight_format"),
    [("tiny-qwen3", "bf16"), ("tiny-qwen2-hd128-untied", "bf16"), ("tiny-llama-untied", "bf16"), ("tiny-qwen3", "fp8")],
)
def test_model_device_bytes_are_what_the_model_allocates(
    fake_driver: FakeDriver, shape: str, weight_format: str
) -> None:
    """model_device_bytes, which a model checks against the device's free memory before its upload, is the sum of
    what the model (layered decode step) allocates: a buffer added to one and not the other fails here."""
    from decoder_service.engines.cuda.forward import CudaModel, model_device_bytes
    from decoder_service.engines.cuda.module import Module

    cfg = SHAPES[shape]
    _, weights = (build_fp8_reference if weight_format == "fp8" else build_reference)(cfg, seed=7)
    before = set(fake_driver.live)
    model = CudaModel(
        cfg,
        weights,
        Module(b"cubin"),
        max_context=96,
        max_prefill=8,
        decode_kernel="layers",
        weight_format=weight_format,
    )
    allocated = sum(fake_driver.sizes[ptr] for ptr in fake_driver.live - before)
    assert sum(model_device_bytes(cfg, 96, 8, weight_format).values()) == allocated
    model.free()


def test_a_model_the_device_cannot_hold_is_refused_before_its_upload(monkeypatch: pytest.MonkeyPatch) -> None:
    """Free memory below the model's bytes: DeviceMemoryError names what the model needs, part by part, and what the
    device has, and nothing was allocated."""
    from decoder_service.engines.cuda.forward import model_device_bytes
    from decoder_service.engines.cuda.memory import DeviceMemoryError, byte_size

    parts = model_device_bytes(SHAPES["tiny-qwen3"], 64, 8, "bf16")
    heap = sum(parts.values()) - 1
    driver = install_fake_driver(monkeypatch, heap_bytes=heap)
    message = (
        rf"the model \(bf16 weights, a KV cache of 64 positions\) needs {byte_size(heap + 1)} of device memory "
        rf"\(weights {byte_size(parts['weights'])}, KV cache {byte_size(parts['KV cache'])}, buffers "
        rf"{byte_size(parts['buffers'])}\); the device has {byte_size(heap)} free of {byte_size(heap)}"
    )
    with pytest.raises(DeviceMemoryError, match=message):
        tiny_qwen3_model()
    assert driver.top == 0


def test_an_allocation_past_free_memory_names_its_size(fake_driver: FakeDriver) -> None:
    from decoder_service.engines.cuda.memory import DeviceBuffer, DeviceMemoryError

    used = DeviceBuffer(48 << 20)
    with pytest.raises(
        DeviceMemoryError, match=r"cuMemAlloc of 1\.50 GiB failed: out of device memory \(16\.0 MiB free of 64\.0 MiB\)"
    ):
        DeviceBuffer(3 << 29)
    used.free()


H200_SM_SHARED = 228 * 1024


@pytest.mark.parametrize(
    ("k_in", "blocks_per_sm", "cap", "stages"),
    [(2048, 2, 6, 3), (6144, 2, 6, 2), (2048, 1, 6, 6), (2048, 2, 2, 2), (6144, 3, 6, 1), (576, 2, 6, 3)],
)
def test_gemv_ring_depth_fits_the_blocks_per_sm(k_in: int, blocks_per_sm: int, cap: int, stages: int) -> None:
    from decoder_service.engines.cuda.forward import (
        GSTREAM_STATIC_SHARED,
        SM_RESERVED_SHARED,
        gemv_stream_shared,
        gemv_stream_stages,
    )

    got = gemv_stream_stages(k_in, blocks_per_sm, H200_SM_SHARED, cap)
    assert got == stages

    def per_sm(depth: int) -> int:
        return blocks_per_sm * (gemv_stream_shared(k_in, depth) + GSTREAM_STATIC_SHARED + SM_RESERVED_SHARED)

    assert per_sm(got) <= H200_SM_SHARED
    assert got == cap or per_sm(got + 1) > H200_SM_SHARED  # the deepest that fits, unless capped


@pytest.mark.parametrize(
    ("k_in", "most", "fixed", "cap", "layout"),
    [
        (2048, 2, None, 6, (2, 3)),  # the Qwen3-1.7B qkv and o rows
        (6144, 2, None, 6, (2, 2)),  # its down rows
        (2048, 3, None, 6, (3, 2)),  # its gate|up rows (SwiGLU output)
        (4096, 3, None, 6, (2, 3)),  # three blocks would leave a ring of 1: two
        (4096, 3, None, 1, (3, 1)),  # unless the cap asks for no more than 1
        (16000, 3, None, 6, (1, 5)),  # rows so wide that only one block keeps a ring of 2
        (2048, 3, 1, 6, (1, 6)),  # TOOLTRIE_GEMV_BLOCKS_PER_SM sets the count
    ],
)
def test_gemv_layout_takes_the_most_blocks_that_keep_a_ring_of_two(
    k_in: int, most: int, fixed: int | None, cap: int, layout: tuple[int, int]
) -> None:
    from decoder_service.engines.cuda.forward import gemv_stream_layout, gemv_stream_stages

    assert gemv_stream_layout(k_in, H200_SM_SHARED, most, fixed, cap) == layout
    blocks, stages = layout
    assert stages == gemv_stream_stages(k_in, blocks, H200_SM_SHARED, cap)


@pytest.mark.parametrize(
    ("k_in", "swiglu", "most", "fixed", "layout"),
    [
        (2048, True, 3, None, (2, 2)),  # the Qwen3-1.7B gate|up: four tokens' rows leave room for two blocks
        (6144, False, 2, None, (1, 4)),  # its down rows: one block
        (576, True, 3, 2, (2, 2)),  # a ring of 3 would split a gate|up pair: 2
        (576, False, 3, 2, (2, 3)),  # a plain GEMV keeps the deepest ring
        (576, True, 3, 1, (1, 6)),
        (2504, True, 3, 1, (1, 5)),  # rows of two pieces are never read as pairs: no need to cut
    ],
)
def test_chain_gemv_layout_keeps_gate_up_pairs_in_the_ring(
    k_in: int, swiglu: bool, most: int, fixed: int | None, layout: tuple[int, int]
) -> None:
    from decoder_service.engines.cuda.forward import CHAIN_TOKENS, gemv_chain_layout, gemv_stream_shared

    assert gemv_chain_layout(k_in, swiglu, H200_SM_SHARED, most, fixed) == layout
    blocks, stages = layout
    assert blocks * gemv_stream_shared(k_in, stages, CHAIN_TOKENS) <= H200_SM_SHARED


@pytest.mark.parametrize(
    ("k_in", "swiglu", "layout"),
    [
        (2048, False, (1, 2)),  # the Qwen3-1.7B qkv and o: a ring of 3 would fit, but 2 leaves room beside it
        (2048, True, (1, 2)),  # its gate|up
        (6144, False, (1, 2)),  # its down: 16 warps with rings of 2 where 8 had rings of 4
        (576, False, (1, 2)),  # SmolLM2's rows
    ],
)
def test_wide_chain_gemv_layout_is_one_block_an_sm_with_rings_of_two(
    k_in: int, swiglu: bool, layout: tuple[int, int]
) -> None:
    from decoder_service.engines.cuda.forward import (
        CHAIN_TOKENS,
        GSTREAM_CHAIN_WIDE_STATIC_SHARED,
        GSTREAM_WIDE_WARPS,
        SM_RESERVED_SHARED,
        gemv_chain_layout,
        gemv_stream_shared,
    )

    # one block an SM whatever the count asked for (TOOLTRIE_GEMV_BLOCKS_PER_SM: 2 here)
    assert gemv_chain_layout(k_in, swiglu, H200_SM_SHARED, 3, 2, warps=GSTREAM_WIDE_WARPS) == layout
    _, stages = layout
    used = gemv_stream_shared(k_in, stages, CHAIN_TOKENS, GSTREAM_WIDE_WARPS) + GSTREAM_CHAIN_WIDE_STATIC_SHARED
    assert used + SM_RESERVED_SHARED <= H200_SM_SHARED


@pytest.mark.parametrize(
    ("setting", "hidden", "warps"),
    [(None, 2048, 16), ("8", 2048, 8), ("16", 4096, 16), (None, 5120, 8), ("12", 2048, None), ("32", 2048, None)],
)
def test_chain_gemv_warps_wide_where_the_halves_can_normalise(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, hidden: int, warps: int | None
) -> None:
    """16-warp chain blocks unless TOOLTRIE_CHAIN_GEMV_WARPS asks for 8 or the RMSNorm rows are wider than one
    staging batch of 256 threads; any other setting is an error."""
    from decoder_service.engines.cuda.forward import chain_gemv_warps

    if setting is None:
        monkeypatch.delenv("TOOLTRIE_CHAIN_GEMV_WARPS", raising=False)
    else:
        monkeypatch.setenv("TOOLTRIE_CHAIN_GEMV_WARPS", setting)
    if warps is None:
        with pytest.raises(ValueError, match="TOOLTRIE_CHAIN_GEMV_WARPS"):
            chain_gemv_warps(hidden)
    else:
        assert chain_gemv_warps(hidden) == warps


def test_gate_up_gemv_runs_three_blocks_per_sm_and_the_others_two(fake_driver: FakeDriver) -> None:
    """The default layout on the emulated H200: the SwiGLU-output GEMV with rings of 2 at three blocks per SM, the
    plain ones (and the dense head) with rings of 3 at two."""
    model = tiny_qwen3_model()
    depths: dict[str, set[int]] = {}
    for launch in model.decode_launches:
        if launch.kernel.name in STREAM_DEPTH_ARG:
            depths.setdefault(launch.kernel.name, set()).add(launch.arg(STREAM_DEPTH_ARG[launch.kernel.name]))
    assert depths == {"gemv_stream_swiglu_bf16": {2}, "gemv_stream_bf16": {3}}
    hidden = SHAPES["tiny-qwen3"].hidden_size
    assert model.gemv_layout[(hidden, True)] == (3 * 132, 2)
    assert model.gemv_layout[(hidden, False)] == (2 * 132, 3)


def test_gemv_ring_that_cannot_fit_is_refused() -> None:
    from decoder_service.engines.cuda.forward import gemv_stream_stages

    with pytest.raises(ValueError, match="TOOLTRIE_GEMV_BLOCKS_PER_SM"):
        gemv_stream_stages(16384, 4, H200_SM_SHARED)


@pytest.mark.parametrize(
    ("env", "error"),
    [
        ({"TOOLTRIE_GEMV_STAGES": "0"}, "TOOLTRIE_GEMV_STAGES=0 is out of range: 1 to 6"),
        ({"TOOLTRIE_GEMV_BLOCKS_PER_SM": "two"}, "TOOLTRIE_GEMV_BLOCKS_PER_SM='two' is not an integer"),
    ],
)
def test_gemv_settings_from_the_environment_are_checked(
    fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], error: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=error):
        tiny_qwen3_model()


def test_gemv_settings_shape_the_decode_launches(fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLTRIE_GEMV_STAGES", "2")
    monkeypatch.setenv("TOOLTRIE_GEMV_BLOCKS_PER_SM", "1")
    model = tiny_qwen3_model()
    streams = [launch for launch in model.decode_launches if launch.kernel.name in STREAM_DEPTH_ARG]
    assert len(streams) == 4 * SHAPES["tiny-qwen3"].num_layers + 1  # qkv, o, gate|up, down per layer, the head
    assert {launch.arg(STREAM_DEPTH_ARG[launch.kernel.name]) for launch in streams} == {2}
    assert max(launch.grid[0] for launch in streams) <= 132  # one block per SM of the emulated H200


def test_rows_of_two_warps_keep_the_register_gemv(fake_driver: FakeDriver) -> None:
    """An MLP wider than the split threshold: its down GEMV (rows of two warps) runs on gemv_bf16, and the ring
    rule, which such rows would not fit at two blocks per SM, is not asked about them."""
    from decoder_service.engines.cuda.forward import GEMV_SPLIT_MIN_K, CudaModel
    from decoder_service.engines.cuda.module import Module
    from decoder_service.models.config import ModelConfig

    wide = 30_000  # a 30,000-wide fp32 input row alone is more than half an SM's shared memory
    assert wide >= GEMV_SPLIT_MIN_K
    cfg = ModelConfig("qwen3", 1000, 64, wide, 1, 2, 1, 32, 1e-6, 1e6, 512, True)
    hf_model, weights = build_reference(cfg, seed=3)
    model = CudaModel(cfg, weights, Module(b"cubin"), max_context=64, max_prefill=8)
    assert model.decode_kernel == "layers"
    assert set(model.gemv_layout) == {(64, False), (64, True)}
    kernels = {launch.label: launch.kernel.name for launch in model.decode_launches}
    assert kernels["gemv:down"] == "gemv_bf16" and kernels["gemv:qkv"] == "gemv_stream_bf16"
    report = compare_greedy(model, hf_model, [5, 9, 2, 7, 1], new_tokens=2)
    assert report["token_mismatches"] == 0, report


def test_fp8_weight_bytes_count_a_byte_a_projection_weight_and_a_scale_a_row() -> None:
    """The floor the benchmarks draw for the FP8 format: Qwen3-1.7B's step reads its 1.41 billion projection weights
    as bytes, plus a 4-byte scale per row, and the rest (norms, tied head) as bf16."""
    from decoder_service.engines.cuda.weights import weight_bytes
    from decoder_service.models.synth import PRESETS

    cfg = PRESETS["qwen3-1.7b"]
    d, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    projection_weights = layers * (d * (q + 2 * kv) + q * d + 3 * d * inter)
    rows = layers * (q + 2 * kv + d + 2 * inter + d)
    assert projection_weights == 1_409_286_144
    assert weight_bytes(cfg, "fp8") == weight_bytes(cfg) - projection_weights + 4 * rows
