"""The persistent decode kernel's host side, without a GPU: the plan layout against the kernel's structs, which models
it serves, how deep its rings are, and its launches on the emulated driver (bit for bit the layered step's there;
the GPU tests compare the kernels themselves)."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest

from decoder_service.engines.cuda.persistent import (
    ATTN_MERGE_BATCH,
    ATTN_MERGE_SPLIT,
    DEFAULT_STAGES,
    LAYER_FIELDS,
    LAYER_FORMAT,
    MAX_SHARED_PER_BLOCK,
    MAX_STAGES,
    PDEC_STATIC_SHARED,
    PLAN_FIELDS,
    PLAN_FORMAT,
    SLOT_BYTES,
    decode_kernel_choice,
    persistent_shared_bytes,
    persistent_stages,
    staging_floats,
    unsupported_reason,
)
from decoder_service.models.config import ModelConfig
from tests.decoder_service.engines.cuda.emulator import FakeDriver, install_fake_driver
from tests.decoder_service.engines.cuda.hf_models import SHAPES
from tooltrie.cuda_build import CUDA_DIR

QWEN3_1_7B = SHAPES["qwen3-1.7b-shape"]
_KINDS = {"int": "i32", "float": "f32", "unsigned": "ptr"}


def _struct_fields(name: str) -> list[tuple[str, str]]:
    """(field, 'ptr' | 'i32' | 'f32') of `struct name { ... };` in cuda/decode_persistent.cuh, in order."""
    source = (CUDA_DIR / "decode_persistent.cuh").read_text()
    body = re.search(rf"struct {name} \{{(.*?)\}};", source, re.S).group(1)
    fields = []
    for decl in body.split(";"):
        decl = re.sub(r"//.*", "", decl).strip()
        if not decl:
            continue
        first, *more = decl.split(",")  # `int a, b, c;` declares three
        words = first.replace("*", " * ").split()
        kind = "ptr" if "*" in words else _KINDS[words[0]]
        fields += [(name.strip(), kind) for name in (words[-1], *more)]
    return fields


def test_plan_layout_is_the_kernels() -> None:
    assert _struct_fields("PdecLayer") == list(LAYER_FIELDS)
    assert _struct_fields("PdecPlan") == list(PLAN_FIELDS)
    # natural alignment, as the device compiler lays the structs out: pointers first, then an even count of words
    assert struct.calcsize(LAYER_FORMAT) == 8 * len(LAYER_FIELDS)
    assert struct.calcsize(PLAN_FORMAT) % 8 == 0


def test_the_split_threshold_is_the_gemvs() -> None:
    from decoder_service.engines.cuda.forward import GEMV_SPLIT_MIN_K
    from decoder_service.engines.cuda.persistent import ONE_WARP_ROW_MAX_K

    assert ONE_WARP_ROW_MAX_K == GEMV_SPLIT_MIN_K


@pytest.mark.parametrize(
    ("config", "max_chunks", "deepest"),
    [
        (QWEN3_1_7B, 32, 12),  # 12 x 16 KB of ring beside a 6,144-wide input row
        (QWEN3_1_7B, 4096, 11),  # a long context's merge table outgrows the input row
        (ModelConfig("qwen3", 1000, 2048, 7680, 1, 16, 8, 128, 1e-6, 1e6, 512, True), 32, 11),
        (SHAPES["smollm2-shape"], 256, 12),
    ],
)
def test_ring_takes_the_shared_memory_the_staging_area_leaves(config: ModelConfig, max_chunks: int, deepest: int):
    assert persistent_stages(config, max_chunks, cap=MAX_STAGES) == deepest
    assert persistent_shared_bytes(config, max_chunks, deepest) + PDEC_STATIC_SHARED <= MAX_SHARED_PER_BLOCK
    if deepest < MAX_STAGES:
        over = persistent_shared_bytes(config, max_chunks, deepest) + SLOT_BYTES + PDEC_STATIC_SHARED
        assert over > MAX_SHARED_PER_BLOCK
    assert persistent_stages(config, max_chunks) == DEFAULT_STAGES  # every warp takes the same share of the tiles
    assert persistent_stages(config, max_chunks, cap=3) == 3


@pytest.mark.parametrize(
    "config", [QWEN3_1_7B, SHAPES["smollm2-shape"], SHAPES["tiny-qwen3"], SHAPES["tiny-qwen2-hd128-untied"]]
)
def test_staging_area_holds_the_serial_merges_table_and_handed_values(config: ModelConfig) -> None:
    # attn_merge_serial: ATTN_MERGE_SPLIT (weight, l) pairs, then a batch of values for each output element.
    need = 2 * ATTN_MERGE_SPLIT + ATTN_MERGE_BATCH * config.head_dim
    assert staging_floats(config, 1) >= need
    assert staging_floats(config, 4096) == max(staging_floats(config, 1), 2 * 4096)


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (ModelConfig("qwen3", 1000, 4096, 12288, 1, 32, 8, 128, 1e-6, 1e6, 512, True), "intermediate_size 12288"),
        (ModelConfig("qwen3", 1000, 8192, 4096, 1, 32, 8, 128, 1e-6, 1e6, 512, True), "hidden_size 8192"),
        (ModelConfig("llama", 1000, 960, 2560, 1, 10, 5, 96, 1e-5, 1e4, 512, True), "head_dim 96"),
        (ModelConfig("qwen3", 1000, 5120, 4096, 1, 40, 8, 128, 1e-6, 1e6, 512, True), "hidden_size 5120 is over 4096"),
    ],
)
def test_models_the_kernel_cannot_run_are_refused_with_the_reason(config: ModelConfig, reason: str) -> None:
    assert reason in unsupported_reason(config, 32)
    assert decode_kernel_choice(config, 32, "layers") == "layers"
    with pytest.raises(ValueError, match=f"cannot run this model: .*{reason}"):
        decode_kernel_choice(config, 32, "persistent")


def test_decode_kernel_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLTRIE_DECODE_KERNEL", raising=False)
    assert decode_kernel_choice(QWEN3_1_7B, 32) == "layers"
    assert unsupported_reason(QWEN3_1_7B, 32) is None
    monkeypatch.setenv("TOOLTRIE_DECODE_KERNEL", "persistent")
    assert decode_kernel_choice(QWEN3_1_7B, 32) == "persistent"
    assert decode_kernel_choice(QWEN3_1_7B, 32, "layers") == "layers"  # an explicit choice wins
    monkeypatch.setenv("TOOLTRIE_DECODE_KERNEL", "fused")
    with pytest.raises(ValueError, match="decode kernel 'fused' is not one of layers, persistent"):
        decode_kernel_choice(QWEN3_1_7B, 32)


@pytest.fixture
def fake_driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    return install_fake_driver(monkeypatch)


def _tiny(decode_kernel: str):
    from decoder_service.engines.cuda.forward import CudaModel
    from decoder_service.engines.cuda.module import Module
    from tests.decoder_service.engines.cuda.hf_models import build_reference

    pytest.importorskip("torch")
    _, weights = build_reference(SHAPES["tiny-qwen2-hd128-untied"], seed=11)
    return CudaModel(
        SHAPES["tiny-qwen2-hd128-untied"], weights, Module(b"cubin"), max_context=96, decode_kernel=decode_kernel
    )


def test_persistent_step_is_one_cooperative_launch_with_the_plan(fake_driver: FakeDriver) -> None:
    model = _tiny("persistent")
    launches = [launch.kernel.name for launch in model.decode_launches]
    assert launches == ["embed_gather", "decode_persistent", "rmsnorm", "gemv_stream_bf16", "argmax"]
    step = model.decode_launches[1]
    assert step.grid == (132, 1, 1) and step.block == (288, 1, 1) and step.cooperative
    assert step.shared_bytes == persistent_shared_bytes(model.config, model.max_chunks, model.persistent.stages)
    plan = fake_driver.view(step.arg(0), np.uint8, struct.calcsize(PLAN_FORMAT)).tobytes()
    fields = dict(zip((name for name, _ in PLAN_FIELDS), struct.unpack(PLAN_FORMAT, plan), strict=True))
    assert fields["x"] == model.x.ptr and fields["done"] == model.attn_done.ptr
    assert fields["words"] == model.persistent.words.ptr
    assert fields["n_layers"] == model.config.num_layers and fields["stages"] == model.persistent.stages
    assert (fields["in_flight"], fields["poll_ns"]) == (3, 1000)
    # the count of finished blocks, then the epoch (tags start at epoch 1)
    assert fields["epoch"] == fields["finished"] + 4
    assert list(fake_driver.view(fields["finished"], np.uint32, 2)) == [0, 1]
    # x, q|k|v, attention's output and the SwiGLU output, one 8-byte word a value, none carrying a tag yet
    c = model.config
    values = c.hidden_size + 2 * c.num_heads * c.head_dim + 2 * c.num_kv_heads * c.head_dim + c.intermediate_size
    assert model.persistent.words.nbytes == 8 * values
    assert not fake_driver.view(fields["words"], np.uint64, values).any()
    model.free()


def test_persistent_and_layered_steps_agree_in_emulation(fake_driver: FakeDriver) -> None:
    """The same numpy references run phase by phase, so the two forms agree bit for bit here too: a check of the
    plan's pointers (a layer's caches, the fused weights, the bias) rather than of the kernels."""
    outputs = {}
    for kind in ("layers", "persistent"):
        model = _tiny(kind)
        model.prefill([7, 3, 9, 1, 4, 4, 8, 2])
        logits = []
        for _ in range(4):
            model.decode()
            logits.append(model.read_logits())
        outputs[kind] = (logits, [buf.download(np.uint16, 12 * model.kv_width, model.stream) for buf in model.k_cache])
        model.free()
    (la, ca), (lp, cp) = outputs["layers"], outputs["persistent"]
    assert all(np.array_equal(a, b) for a, b in zip(la, lp, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(ca, cp, strict=True))


def test_producer_cap_and_poll_sleep_come_from_the_environment(
    fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLTRIE_PERSISTENT_IN_FLIGHT", "2")
    monkeypatch.setenv("TOOLTRIE_PERSISTENT_POLL_NS", "0")
    model = _tiny("persistent")
    plan = fake_driver.view(model.decode_launches[1].arg(0), np.uint8, struct.calcsize(PLAN_FORMAT)).tobytes()
    fields = dict(zip((name for name, _ in PLAN_FIELDS), struct.unpack(PLAN_FORMAT, plan), strict=True))
    assert (fields["in_flight"], fields["poll_ns"]) == (2, 0)
    model.free()
    monkeypatch.setenv("TOOLTRIE_PERSISTENT_IN_FLIGHT", "13")
    with pytest.raises(ValueError, match="TOOLTRIE_PERSISTENT_IN_FLIGHT=13 is out of range: 1 to 12"):
        _tiny("persistent")
