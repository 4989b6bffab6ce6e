"""Each kernel on the GPU against its float64 numpy reference, on fresh random inputs with NaN-poisoned outputs.

Operands are bf16 (weights) or fp32 (activations); the bound is ||out - ref|| / ||ref|| <= 1e-2, and the
measured errors are recorded for the results file."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import numpy as np
import pytest

from decoder_service.engines.cpu.kv_cache import round_to_bf16
from decoder_service.engines.cuda.forward import (
    ATTN_CHUNK,
    ATTN_COMPILED_HEAD_DIMS,
    ATTN_THREADS,
    GSTREAM_THREADS,
    SHORT_ATTENTION_POSITIONS,
    gemm_mma_shared,
    gemm_mma_tokens,
    gemv_groups,
    gemv_stream_shared,
    gstream_slot_bytes,
    prefill_attention_kernel,
    prefill_attention_shared,
)
from decoder_service.engines.cuda.memory import DeviceBuffer, to_bf16_bits
from decoder_service.models.bf16 import bf16_bits_to_float32
from decoder_service.models.fp8 import fp8_rows, quantize_rows
from tests.decoder_service.engines.cuda import reference as ref
from tests.decoder_service.engines.cuda.gpu_harness import Device, bf16_random, load_module, record, requires_gpu

pytestmark = requires_gpu
TOL = 1e-2
F32 = np.float32


@pytest.fixture(scope="module")
def device_ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    from decoder_service.engines.cuda.driver import Stream

    module = load_module(tmp_path_factory.mktemp("cubin"))
    stream = Stream()
    yield module, stream
    stream.destroy()


@pytest.fixture
def dev(device_ctx: tuple) -> Iterator[Device]:
    d = Device(*device_ctx)
    yield d
    d.free()


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))  # stable per test case


def check(name: str, out: np.ndarray, expected: np.ndarray) -> None:
    err = ref.rel_err(out, expected)
    record("kernel", name, rel_err=err)
    assert err <= TOL, f"{name}: relative error {err}"


def test_embed_gather(dev: Device, rng: np.random.Generator) -> None:
    vocab, hidden = 5000, 576
    bits, table = bf16_random(rng, (vocab, hidden))
    tokens = np.array([0, vocab - 1, 17, 2500, 17], dtype=np.int32)
    t_buf, tok_buf, out = dev.put(bits), dev.put(tokens), dev.poisoned(len(tokens) * hidden)
    dev.launch(
        "embed_gather",
        (len(tokens), 1, 1),
        (256, 1, 1),
        [("ptr", t_buf.ptr), ("ptr", tok_buf.ptr), ("i32", 0), ("ptr", out.ptr), ("i32", hidden), ("i32", vocab)],
    )
    check("embed_gather/device-tokens", dev.get(out, F32, (len(tokens), hidden)), ref.embed(table, tokens))
    one = dev.poisoned(hidden)
    dev.launch(
        "embed_gather",
        (1, 1, 1),
        (256, 1, 1),
        [("ptr", t_buf.ptr), ("ptr", 0), ("i32", 42), ("ptr", one.ptr), ("i32", hidden), ("i32", vocab)],
    )
    check("embed_gather/host-token", dev.get(one, F32, hidden), table[42])
    dev.launch(
        "embed_gather",
        (1, 1, 1),
        (256, 1, 1),
        [("ptr", t_buf.ptr), ("ptr", 0), ("i32", vocab), ("ptr", one.ptr), ("i32", hidden), ("i32", vocab)],
    )
    assert np.isnan(dev.get(one, F32, hidden)).all(), "an out-of-range id must not yield a plausible row"


@pytest.mark.parametrize("n", [576, 2048])
def test_rmsnorm(dev: Device, rng: np.random.Generator, n: int) -> None:
    rows = 3
    x = (2.0 * rng.standard_normal((rows, n))).astype(F32)
    wbits, w = bf16_random(rng, n, 0.2, 1.0)
    xb, wb, out = dev.put(x), dev.put(wbits), dev.poisoned(rows * n)
    dev.launch(
        "rmsnorm",
        (rows, 1, 1),
        (256, 1, 1),
        [("ptr", xb.ptr), ("ptr", wb.ptr), ("ptr", out.ptr), ("i32", n), ("f32", 1e-6)],
    )
    check(f"rmsnorm/n={n}", dev.get(out, F32, (rows, n)), ref.rmsnorm(x, w, 1e-6))


GEMV_CASES = [  # n_out, k_in, tokens, bias, residual, x_mode, split, y_mode
    (1000, 576, 1, True, True, 0, 2, 0),
    (4096, 2048, 1, True, False, 1, 4, 0),
    (2048, 6144, 1, False, True, 0, 8, 0),
    (100, 64, 3, True, True, 1, 1, 0),
    (100, 256, 3, True, False, 0, 1, 1),  # SwiGLU output; the last group runs past the end
    (49152, 576, 1, False, False, 1, 1, 0),
    (1001, 2048, 2, True, True, 0, 8, 0),
    (77, 4096, 1, False, True, 1, 2, 0),
    (12288, 2048, 1, False, False, 1, 1, 1),  # the Qwen3-1.7B gate|up shape
    (300, 1024, 2, False, False, 1, 4, 1),  # two warps per row, two gate rows and their up rows per group
]
IN_MODES = {0: "plain", 1: "rmsnorm"}
OUT_MODES = {0: "", 1: "/swiglu-out"}


def gemv_launch(
    dev: Device,
    grid_x: int,
    tokens: int,
    w,
    x,
    norm_w,
    x_mode: int,
    eps: float,
    bias,
    residual,
    y,
    n_out: int,
    k_in: int,
    split: int,
    y_mode: int = 0,
) -> None:
    """gemv_bf16 (y_mode 0) or gemv_swiglu_bf16 (y_mode 1, no residual); buffers may be None (a null pointer)."""
    args = gemv_args(w, x, norm_w, x_mode, eps, bias, residual, y, bool(y_mode))
    dev.launch(
        "gemv_swiglu_bf16" if y_mode else "gemv_bf16",
        (grid_x, tokens, 1),
        (256, 1, 1),
        [*args, ("i32", n_out), ("i32", k_in), ("i32", split)],
        shared=4 * k_in,
    )


def gemv_args(w, x, norm_w, x_mode: int, eps: float, bias, residual, y, swiglu: bool) -> list[tuple[str, int | float]]:
    """The arguments every GEMV kernel starts with, up to its output; a SwiGLU-output kernel takes no residual.
    Buffers may be None (a null pointer)."""
    ptr = [("ptr", buf.ptr if buf is not None else 0) for buf in (w, x, norm_w)]
    outputs = [("ptr", buf.ptr if buf is not None else 0) for buf in ((bias, y) if swiglu else (bias, residual, y))]
    return [*ptr, ("i32", x_mode), ("f32", eps), *outputs]


@pytest.mark.parametrize(("n_out", "k_in", "tokens", "bias", "residual", "x_mode", "split", "y_mode"), GEMV_CASES)
def test_gemv(
    dev: Device,
    rng: np.random.Generator,
    n_out: int,
    k_in: int,
    tokens: int,
    bias: bool,
    residual: bool,
    x_mode: int,
    split: int,
    y_mode: int,
) -> None:
    wbits, w = bf16_random(rng, (n_out, k_in), 0.05)
    bbits, b = bf16_random(rng, n_out, 0.5)
    nbits, nw = bf16_random(rng, k_in, 0.2, 1.0)
    x = (2.0 * rng.standard_normal((tokens, k_in))).astype(F32)
    r = rng.standard_normal((tokens, n_out)).astype(F32)
    wb, xb, nb = dev.put(wbits), dev.put(x), dev.put(nbits)
    bb = dev.put(bbits) if bias else None
    n_y = n_out // 2 if y_mode == 1 else n_out
    y = dev.put(r) if residual else dev.poisoned(tokens * n_y)  # in place over the residual, as the engine does
    norm = nb if x_mode == 1 else None
    grid_x = gemv_groups(n_out, split, y_mode == 1)
    gemv_launch(
        dev, grid_x, tokens, wb, xb, norm, x_mode, 1e-5, bb, y if residual else None, y, n_out, k_in, split, y_mode
    )
    inputs = ref.rmsnorm(x, nw, 1e-5) if x_mode == 1 else x
    expected = ref.linear(inputs, w, b if bias else None, r if residual else None)
    if y_mode == 1:
        expected = ref.swiglu(expected)
    name = f"gemv/{IN_MODES[x_mode]}{OUT_MODES[y_mode]}/{n_out}x{k_in}x{tokens}/split{split}"
    check(name, dev.get(y, F32, (tokens, n_y)), expected)


def test_gemv_fused_rmsnorm_equals_rmsnorm_kernel(dev: Device, rng: np.random.Generator) -> None:
    """Decode fuses the norm into the GEMV; it must give the same bits as rmsnorm followed by a plain GEMV."""
    n_out, k_in = 512, 2048
    wbits, _ = bf16_random(rng, (n_out, k_in), 0.05)
    nbits, _ = bf16_random(rng, k_in, 0.2, 1.0)
    x = (3.0 * rng.standard_normal(k_in)).astype(F32)
    wb, xb, nb, xn = dev.put(wbits), dev.put(x), dev.put(nbits), dev.poisoned(k_in)
    fused, plain = dev.poisoned(n_out), dev.poisoned(n_out)
    dev.launch(
        "rmsnorm",
        (1, 1, 1),
        (256, 1, 1),
        [("ptr", xb.ptr), ("ptr", nb.ptr), ("ptr", xn.ptr), ("i32", k_in), ("f32", 1e-6)],
    )
    for x_in, norm, mode, y in ((xn, None, 0, plain), (xb, nb, 1, fused)):
        gemv_launch(dev, n_out // 2, 1, wb, x_in, norm, mode, 1e-6, None, None, y, n_out, k_in, 4)
    same = bool(np.array_equal(dev.get(fused, F32, n_out), dev.get(plain, F32, n_out)))
    record("kernel", "gemv/fused-rmsnorm-bit-identical", exact=same)
    assert same


@pytest.mark.parametrize(("inter", "split"), [(6144, 1), (150, 2)])
def test_gemv_swiglu_output_equals_swiglu_kernel(dev: Device, rng: np.random.Generator, inter: int, split: int) -> None:
    """Decode writes silu(gate) * up from the gate|up GEMV (gemv_swiglu_bf16); it must give the bits of the plain
    GEMV followed by the swiglu kernel (prefill's path)."""
    k_in = 2048
    wbits, _ = bf16_random(rng, (2 * inter, k_in), 0.05)
    nbits, _ = bf16_random(rng, k_in, 0.2, 1.0)
    x = (3.0 * rng.standard_normal(k_in)).astype(F32)
    wb, xb, nb = dev.put(wbits), dev.put(x), dev.put(nbits)
    gate_up, fused, unfused = dev.poisoned(2 * inter), dev.poisoned(inter), dev.poisoned(inter)
    gemv_launch(dev, gemv_groups(2 * inter, split), 1, wb, xb, nb, 1, 1e-6, None, None, gate_up, 2 * inter, k_in, split)
    dev.launch(
        "swiglu", (8, 1, 1), (256, 1, 1), [("ptr", gate_up.ptr), ("ptr", unfused.ptr), ("i32", 1), ("i32", inter)]
    )
    grid_x = gemv_groups(2 * inter, split, swiglu_out=True)
    gemv_launch(dev, grid_x, 1, wb, xb, nb, 1, 1e-6, None, None, fused, 2 * inter, k_in, split, y_mode=1)
    same = bool(np.array_equal(dev.get(fused, F32, inter), dev.get(unfused, F32, inter)))
    record("kernel", f"gemv/swiglu-out-bit-identical/{inter}/split{split}", exact=same)
    assert same


@pytest.mark.parametrize(
    ("n_out", "k_in", "x_mode", "split", "y_mode"),
    [(1001, 2048, 1, 1, 0), (300, 6144, 0, 2, 0), (77, 1024, 0, 4, 0), (1202, 2048, 1, 1, 1)],
)
def test_gemv_grid_changes_no_bits(
    dev: Device, rng: np.random.Generator, n_out: int, k_in: int, x_mode: int, split: int, y_mode: int
) -> None:
    """Blocks stride over row groups: a grid of a few blocks must give the bits of one block per group."""
    wbits, _ = bf16_random(rng, (n_out, k_in), 0.05)
    bbits, _ = bf16_random(rng, n_out, 0.5)
    nbits, _ = bf16_random(rng, k_in, 0.2, 1.0)
    x = (2.0 * rng.standard_normal(k_in)).astype(F32)
    n_y = n_out // 2 if y_mode == 1 else n_out
    r = rng.standard_normal(n_y).astype(F32)
    wb, xb, nb, bb = dev.put(wbits), dev.put(x), dev.put(nbits), dev.put(bbits)
    outs = []
    for cols in (gemv_groups(n_out, split, y_mode == 1), 3, 1):
        y = dev.put(r)  # in place over the residual, as the engine does (SwiGLU output: overwritten)
        norm, residual = nb if x_mode == 1 else None, None if y_mode else y
        gemv_launch(dev, cols, 1, wb, xb, norm, x_mode, 1e-5, bb, residual, y, n_out, k_in, split, y_mode)
        outs.append(dev.get(y, F32, n_y))
    same = all(np.array_equal(outs[0], o) for o in outs[1:])
    record("kernel", f"gemv/grid-independent/{n_out}x{k_in}/split{split}{OUT_MODES[y_mode]}", exact=same)
    assert same


def gemv_stream_launch(
    dev: Device,
    grid_x: int,
    tokens: int,
    w,
    x,
    norm_w,
    x_mode: int,
    bias,
    residual,
    y,
    n_out: int,
    k_in: int,
    stages: int,
    swiglu: bool,
) -> None:
    """gemv_stream_bf16, or gemv_stream_swiglu_bf16 (no residual); buffers may be None (a null pointer)."""
    name = "gemv_stream_swiglu_bf16" if swiglu else "gemv_stream_bf16"
    shared = gemv_stream_shared(k_in, stages)
    dev.module.kernel(name).set_max_dynamic_shared(shared)
    args = [*gemv_args(w, x, norm_w, x_mode, 1e-5, bias, residual, y, swiglu), ("i32", n_out), ("i32", k_in)]
    dev.launch(name, (grid_x, tokens, 1), (GSTREAM_THREADS, 1, 1), [*args, ("i32", stages)], shared=shared)


@pytest.mark.parametrize(
    ("n_out", "k_in", "tokens", "x_mode", "bias", "residual", "swiglu"),
    [
        (4096, 2048, 1, 1, True, False, False),  # the Qwen3-1.7B qkv shape, with a Qwen2-style bias
        (2048, 6144, 1, 0, False, True, False),  # its MLP down: three 2,048-column pieces per row
        (520, 6144, 1, 1, True, True, False),  # a norm over more than one staging batch
        (1001, 576, 2, 1, False, True, False),  # SmolLM2's width: a part piece, a part group, two tokens
        (2 * 1536, 576, 1, 1, False, False, True),  # SmolLM2's gate|up
        (2 * 150, 2504, 1, 1, True, False, True),  # a whole piece and a part one, a part group
        (2 * 6144, 2048, 1, 1, False, False, True),  # the Qwen3-1.7B gate|up
    ],
)
def test_gemv_stream_equals_gemv(
    dev: Device,
    rng: np.random.Generator,
    n_out: int,
    k_in: int,
    tokens: int,
    x_mode: int,
    bias: bool,
    residual: bool,
    swiglu: bool,
) -> None:
    """The streaming GEMV gives the bits of gemv_bf16 (gemv_swiglu_bf16) with one warp per row, whatever its
    grid and ring depth: decode uses it in their place, and the sparse head and prefill match those bits."""
    wbits, w = bf16_random(rng, (n_out, k_in), 0.05)
    bbits, b = bf16_random(rng, n_out, 0.5)
    nbits, nw = bf16_random(rng, k_in, 0.2, 1.0)
    x = (2.0 * rng.standard_normal((tokens, k_in))).astype(F32)
    n_y = n_out // 2 if swiglu else n_out
    r = rng.standard_normal((tokens, n_y)).astype(F32)
    wb, xb = dev.put(wbits), dev.put(x)
    norm, bb = dev.put(nbits) if x_mode == 1 else None, dev.put(bbits) if bias else None

    def out_buffer() -> DeviceBuffer:
        return dev.put(r) if residual else dev.poisoned(tokens * n_y)  # in place over the residual

    y = out_buffer()
    shared = 4 * k_in
    if shared > 48 * 1024 - 1024:
        dev.module.kernel("gemv_bf16").set_max_dynamic_shared(shared)
    groups = gemv_groups(n_out, 1, swiglu)
    gemv_launch(
        dev, groups, tokens, wb, xb, norm, x_mode, 1e-5, bb, y if residual else None, y, n_out, k_in, 1, int(swiglu)
    )
    expected_bits = dev.get(y, F32, (tokens, n_y))
    inputs = ref.rmsnorm(x, nw, 1e-5) if x_mode == 1 else x
    expected = ref.linear(inputs, w, b if bias else None, r if residual else None)
    if swiglu:
        expected = ref.swiglu(expected)
    label = f"gemv_stream/{IN_MODES[x_mode]}{OUT_MODES[int(swiglu)]}/{n_out}x{k_in}x{tokens}"
    check(label, expected_bits, expected)
    for grid_x, stages in ((groups, 3), (min(132, groups), 3), (7, 1), (1, 6), (5, 2)):
        y = out_buffer()
        gemv_stream_launch(
            dev,
            grid_x,
            tokens,
            wb,
            xb,
            norm,
            x_mode,
            bb,
            y if residual else None,
            y,
            n_out,
            k_in,
            stages,
            swiglu,
        )
        out = dev.get(y, F32, (tokens, n_y))
        check(f"{label}/grid{grid_x}/stages{stages}", out, expected)
        same = bool(np.array_equal(out, expected_bits))
        record("kernel", f"{label}/grid{grid_x}/stages{stages}/bit-identical", exact=same)
        assert same, f"{label}: grid {grid_x}, {stages} stages differ from gemv_bf16"


@pytest.mark.parametrize(
    ("n_out", "k_in", "tokens", "x_mode", "bias", "residual", "swiglu"),
    [
        (4096, 2048, 1, 1, True, False, False),  # the Qwen3-1.7B qkv shape, with a bias: a row per piece
        (2048, 6144, 1, 0, False, True, False),  # its down: a 4,096-column piece and a 2,048 one per row
        (2 * 6144, 2048, 1, 1, False, False, True),  # its gate|up
        (1001, 576, 2, 1, False, True, False),  # SmolLM2's width: rows shorter than a piece, two tokens
        (2 * 150, 4112, 1, 1, True, False, True),  # a whole piece and one of 16 columns, a part group
    ],
)
def test_gemv_stream_fp8_equals_bf16_on_the_same_weights(
    dev: Device,
    rng: np.random.Generator,
    n_out: int,
    k_in: int,
    tokens: int,
    x_mode: int,
    bias: bool,
    residual: bool,
    swiglu: bool,
) -> None:
    """gemv_stream_fp8 (gemv_stream_swiglu_fp8) on e4m3 rows and their power-of-two scales gives the bits of
    gemv_stream_bf16 (gemv_stream_swiglu_bf16) on the dequantized weights, whatever its grid and ring depth. Rows
    of magnitudes from 1e-3 to 10 give each row its own scale; one row is zero."""
    magnitudes = np.exp(rng.uniform(np.log(1e-3), np.log(10.0), (n_out, 1)))
    weights = quantize_rows((rng.standard_normal((n_out, k_in)) * magnitudes * 0.05).astype(F32))
    weights[n_out // 3] = 0.0
    codes, scales = fp8_rows(weights)
    assert len(np.unique(scales)) > 8
    bbits, b = bf16_random(rng, n_out, 0.5)
    nbits, nw = bf16_random(rng, k_in, 0.2, 1.0)
    x = (2.0 * rng.standard_normal((tokens, k_in))).astype(F32)
    n_y = n_out // 2 if swiglu else n_out
    r = rng.standard_normal((tokens, n_y)).astype(F32)
    wb, cb, sb, xb = dev.put(to_bf16_bits(weights)), dev.put(codes), dev.put(scales), dev.put(x)
    norm, bb = dev.put(nbits) if x_mode == 1 else None, dev.put(bbits) if bias else None

    def out_buffer() -> DeviceBuffer:
        return dev.put(r) if residual else dev.poisoned(tokens * n_y)  # in place over the residual

    groups = gemv_groups(n_out, 1, swiglu)
    y = out_buffer()
    res = y if residual else None
    gemv_stream_launch(dev, groups, tokens, wb, xb, norm, x_mode, bb, res, y, n_out, k_in, 2, swiglu)
    expected_bits = dev.get(y, F32, (tokens, n_y))
    inputs = ref.rmsnorm(x, nw, 1e-5) if x_mode == 1 else x
    expected = ref.linear(inputs, weights.astype(np.float64), b if bias else None, r if residual else None)
    if swiglu:
        expected = ref.swiglu(expected)
    label = f"gemv_stream_fp8/{IN_MODES[x_mode]}{OUT_MODES[int(swiglu)]}/{n_out}x{k_in}x{tokens}"
    check(label, expected_bits, expected)
    name = "gemv_stream_swiglu_fp8" if swiglu else "gemv_stream_fp8"
    for grid_x, stages in ((groups, 6), (min(132, groups), 4), (7, 1), (1, 6), (5, 2)):
        shared = gemv_stream_shared(k_in, stages, slot_bytes=gstream_slot_bytes(k_in, 1))
        dev.module.kernel(name).set_max_dynamic_shared(shared)
        y = out_buffer()
        args = gemv_args(cb, xb, norm, x_mode, 1e-5, bb, y if residual else None, y, swiglu)
        args.insert(1, ("ptr", sb.ptr))
        dev.launch(
            name,
            (grid_x, tokens, 1),
            (GSTREAM_THREADS, 1, 1),
            [*args, ("i32", n_out), ("i32", k_in), ("i32", stages)],
            shared=shared,
        )
        out = dev.get(y, F32, (tokens, n_y))
        same = bool(np.array_equal(out, expected_bits))
        record("kernel", f"{label}/grid{grid_x}/stages{stages}/bit-identical", exact=same)
        assert same, f"{label}: grid {grid_x}, {stages} stages differ from gemv_stream_bf16 on the same weights"


@pytest.mark.parametrize(
    ("n_out", "k_in", "x_mode", "bias", "residual", "swiglu", "stages"),
    [
        (2 * 6144, 2048, 1, False, False, True, 2),  # the Qwen3-1.7B gate|up: gate and up rows read as pairs
        (2 * 6144, 2048, 1, False, False, True, 3),  # an odd ring: one row at a time
        (2 * 1536, 576, 1, True, False, True, 4),  # SmolLM2's gate|up, pairs in a deeper ring
        (2 * 150, 2504, 1, True, False, True, 2),  # rows of two pieces: one row at a time
        (2048, 6144, 0, False, True, False, 4),  # the Qwen3-1.7B down: plain rows copied straight to shared memory
        (4096, 2048, 1, True, False, False, 2),  # its qkv, with a bias (16 warps: a warp's rows in pairs)
        (2048, 2048, 0, False, True, False, 2),  # its o, with the residual (pairs at the grid of 31)
        (520, 6144, 1, True, True, False, 2),  # a norm over more than one staging batch: tokens one after another
        (1001, 576, 1, False, True, False, 3),  # a part piece and a part group
    ],
)
@pytest.mark.parametrize("warps", [8, 16])
def test_gemv_stream_chain_equals_the_single_token_kernel(
    dev: Device,
    rng: np.random.Generator,
    n_out: int,
    k_in: int,
    x_mode: int,
    bias: bool,
    residual: bool,
    swiglu: bool,
    stages: int,
    warps: int,
) -> None:
    """A forced chain's GEMV (2 to GSTREAM_CHAIN_TOKENS tokens in one pass over the weights) gives every token the
    bits of the single-token kernel, whatever the ring, the grid and the block's warps (16: each half of the block
    normalises its tokens as an 8-warp block does, and a warp's plain rows go in pairs): gate 12 (a chain's pass == a
    pass per token) rests on it."""
    from decoder_service.engines.cuda.forward import (
        CHAIN_TOKENS,
        GSTREAM_CHAIN_WIDE_STATIC_SHARED,
        GSTREAM_WIDE_MAX_NORM_K,
        MAX_SHARED_PER_BLOCK,
        chain_gemv_kernels,
    )

    if warps == 16 and x_mode == 1 and k_in > GSTREAM_WIDE_MAX_NORM_K:
        pytest.skip("the 16-warp form normalises rows of one staging batch; the host keeps wider ones on 8 warps")

    wbits, _ = bf16_random(rng, (n_out, k_in), 0.05)
    bbits, _ = bf16_random(rng, n_out, 0.5)
    nbits, _ = bf16_random(rng, k_in, 0.2, 1.0)
    n_y = n_out // 2 if swiglu else n_out
    wb = dev.put(wbits)
    norm, bb = dev.put(nbits) if x_mode == 1 else None, dev.put(bbits) if bias else None
    name = chain_gemv_kernels(warps)[int(swiglu)]
    room = MAX_SHARED_PER_BLOCK - GSTREAM_CHAIN_WIDE_STATIC_SHARED
    while gemv_stream_shared(k_in, stages, CHAIN_TOKENS, warps) > room:
        stages -= 1  # twice the warps: twice a stage's bytes
    shared = gemv_stream_shared(k_in, stages, CHAIN_TOKENS, warps)
    dev.module.kernel(name).set_max_dynamic_shared(shared)
    label = f"{name}/{IN_MODES[x_mode]}{OUT_MODES[int(swiglu)]}/{n_out}x{k_in}/stages{stages}"
    for count in range(2, CHAIN_TOKENS + 1):
        x = (2.0 * rng.standard_normal((CHAIN_TOKENS, k_in))).astype(F32)  # rows past count are never read
        r = rng.standard_normal((CHAIN_TOKENS, n_y)).astype(F32)
        xb = dev.put(x)
        single = dev.put(r) if residual else dev.poisoned(CHAIN_TOKENS * n_y)
        gemv_stream_launch(
            dev, 132, count, wb, xb, norm, x_mode, bb, single if residual else None, single, n_out, k_in, 3, swiglu
        )
        want = dev.get(single, F32, (CHAIN_TOKENS, n_y))[:count]
        for grid_x in (132, 31):  # 31: several groups a warp, so rows in pairs and a warp's last row alone
            chain = dev.put(r) if residual else dev.poisoned(CHAIN_TOKENS * n_y)
            args = [*gemv_args(wb, xb, norm, x_mode, 1e-5, bb, chain if residual else None, chain, swiglu)]
            count_buf = dev.put(np.array([count], np.int32))
            args += [("i32", n_out), ("i32", k_in), ("i32", stages), ("ptr", count_buf.ptr)]
            dev.launch(name, (grid_x, 1, 1), (32 * warps, 1, 1), args, shared=shared)
            got = dev.get(chain, F32, (CHAIN_TOKENS, n_y))
            same = bool(np.array_equal(got[:count], want))
            record("kernel", f"{label}/grid{grid_x}/tokens{count}/bit-identical", exact=same)
            assert same, f"{label}: grid {grid_x}, a chain of {count} tokens differs from the single-token kernel"
            if residual:  # rows past the chain's keep their residual
                assert np.array_equal(got[count:], r[count:])


def _gemm_args(x, w, bias, residual, out, m: int, n_out: int, k_in: int) -> list[tuple[str, int | float]]:
    """The argument list of gemm_bf16 and the tensor-core GEMMs."""
    pointers = [("ptr", buf.ptr) for buf in (x, w, bias, residual, out)]
    return [*pointers, ("i32", m), ("i32", n_out), ("i32", k_in)]


@pytest.mark.parametrize(("m", "n_out", "k_in"), [(70, 130, 200), (200, 2048, 576), (2, 33, 64)])
def test_gemm(dev: Device, rng: np.random.Generator, m: int, n_out: int, k_in: int) -> None:
    wbits, w = bf16_random(rng, (n_out, k_in), 0.05)
    bbits, b = bf16_random(rng, n_out, 0.5)
    x = rng.standard_normal((m, k_in)).astype(F32)
    r = rng.standard_normal((m, n_out)).astype(F32)
    wb, xb, bb, rb, out = dev.put(wbits), dev.put(x), dev.put(bbits), dev.put(r), dev.poisoned(m * n_out)
    dev.launch(
        "gemm_bf16",
        (-(-n_out // 64), -(-m // 64), 1),
        (256, 1, 1),
        _gemm_args(xb, wb, bb, rb, out, m, n_out, k_in),
    )
    check(f"gemm/{m}x{n_out}x{k_in}", dev.get(out, F32, (m, n_out)), ref.linear(x, w, b, r))


def _gemm_mma_form(dev: Device, k_in: int) -> tuple[str, int, int]:
    """The 16- or 8-token tensor-core GEMM for inputs k_in wide, its shared memory allowed: (kernel, tokens, shared)."""
    tokens = gemm_mma_tokens(k_in)
    kernel, shared = f"gemm_mma{tokens}_bf16", gemm_mma_shared(tokens, k_in)
    dev.module.kernel(kernel).set_max_dynamic_shared(shared)
    return kernel, tokens, shared


def _gemm_operands(
    dev: Device, rng: np.random.Generator, m: int, n_out: int, k_in: int
) -> tuple[tuple[np.ndarray, ...], tuple[DeviceBuffer, ...]]:
    """Random bf16 weights and bias, fp32 inputs and residual: their values (w, b, x, r) and device copies."""
    wbits, w = bf16_random(rng, (n_out, k_in), 0.05)
    bbits, b = bf16_random(rng, n_out, 0.5)
    x = rng.standard_normal((m, k_in)).astype(F32)
    r = rng.standard_normal((m, n_out)).astype(F32)
    return (w, b, x, r), (dev.put(wbits), dev.put(x), dev.put(bbits), dev.put(r))


# The tensor-core kernels (the prefill GEMM and attention) carry each fp32 input as two bf16 terms (about 16
# significant bits; measured 1e-6 to 4e-6): their error must stay far below what inputs cast to bf16 alone would give
# (bf16 rounds at 2^-9, about 2e-3), which the general bound would let pass.
MMA_TOL = 1e-4


@pytest.mark.parametrize(
    ("m", "n_out", "k_in"),
    [(1, 130, 224), (13, 2048, 576), (37, 520, 6144), (70, 200, 2048), (16, 33, 64), (20, 300, 3072)],
)
def test_gemm_mma(dev: Device, rng: np.random.Generator, m: int, n_out: int, k_in: int) -> None:
    """The tensor-core prefill GEMM against float64; any grid gives the same bits, and so does a token run alone
    (its results do not depend on the tokens staged beside it)."""

    kernel, tokens, shared = _gemm_mma_form(dev, k_in)
    (w, b, x, r), (wb, xb, bb, rb) = _gemm_operands(dev, rng, m, n_out, k_in)
    groups = -(-n_out // 64)

    def run(row_blocks: int) -> np.ndarray:
        out = dev.poisoned(m * n_out)
        args = _gemm_args(xb, wb, bb, rb, out, m, n_out, k_in)
        dev.launch(kernel, (-(-m // tokens), row_blocks, 1), (256, 1, 1), args, shared)
        return dev.get(out, F32, (m, n_out))

    outs = [run(row_blocks) for row_blocks in (groups, max(1, groups // 3))]
    expected = ref.linear(x, w, b, r)
    check(f"gemm_mma{tokens}/{m}x{n_out}x{k_in}", outs[0], expected)
    err = float(np.linalg.norm(outs[0] - expected) / np.linalg.norm(expected))
    assert err <= MMA_TOL, f"relative error {err:.2e}: the inputs' low bf16 terms are not in the sums"
    assert np.array_equal(outs[0], outs[1])
    t = m - 1  # the last token, alone
    alone = dev.poisoned(n_out)
    dev.launch(
        kernel,
        (1, groups, 1),
        (256, 1, 1),
        _gemm_args(dev.put(x[t].copy()), wb, bb, dev.put(r[t].copy()), alone, 1, n_out, k_in),
        shared,
    )
    same = np.array_equal(dev.get(alone, F32, n_out), outs[0][t])
    record("kernel", f"gemm_mma{tokens}/token-alone-bit-identical/{m}x{n_out}x{k_in}", exact=same)
    assert same


@pytest.mark.parametrize(
    ("m", "n_out", "k_in"), [(1, 130, 224), (13, 2048, 576), (37, 520, 6144), (70, 300, 2048), (16, 33, 64)]
)
def test_gemm_mma_row_forms(dev: Device, rng: np.random.Generator, m: int, n_out: int, k_in: int) -> None:
    """The 32- and 128-row forms of the tensor-core GEMM, and the 64-row group on sixteen warps (the w form), give
    the 64-row form's bits, each at a block per row group and at a third of that (several groups a block; 70
    tokens: several token groups)."""
    from decoder_service.engines.cuda.forward import GEMM_MMA_ROW_FORMS, gemm_mma_row_kernel, gemm_mma_wide_kernel

    kernel, tokens, shared = _gemm_mma_form(dev, k_in)
    _, (wb, xb, bb, rb) = _gemm_operands(dev, rng, m, n_out, k_in)
    args = (xb, wb, bb, rb)

    def run(name: str, room: int, row_blocks: int, threads: int = 256) -> np.ndarray:
        out = dev.poisoned(m * n_out)
        grid = (-(-m // tokens), row_blocks, 1)
        dev.launch(name, grid, (threads, 1, 1), _gemm_args(*args, out, m, n_out, k_in), room)
        return dev.get(out, F32, (m, n_out)).view(np.uint32)

    want = run(kernel, shared, -(-n_out // 64))
    forms = [(gemm_mma_row_kernel(tokens, r), gemm_mma_shared(tokens, k_in, r), r, 256) for r in (32, 128)]
    forms.append((gemm_mma_wide_kernel(tokens), shared, 64, 512))
    assert {rows for _, _, rows, _ in forms} == set(GEMM_MMA_ROW_FORMS)
    for name, room, rows, threads in forms:
        dev.module.kernel(name).set_max_dynamic_shared(room)
        groups = -(-n_out // rows)
        for row_blocks in sorted({groups, max(1, groups // 3)}):
            same = np.array_equal(run(name, room, row_blocks, threads), want)
            record("kernel", f"{name}/bit-identical/{m}x{n_out}x{k_in}/rows{row_blocks}", exact=same)
            assert same, f"{name} at {row_blocks} row blocks differs from {kernel}"


@pytest.mark.parametrize(
    ("m", "n_out", "k_in"),
    [(1, 130, 224), (13, 2048, 576), (37, 520, 6144), (48, 4096, 2048), (70, 200, 2048), (16, 33, 64), (20, 300, 3072)],
)
def test_gemm_mma_cluster(dev: Device, rng: np.random.Generator, m: int, n_out: int, k_in: int) -> None:
    """The cluster prefill GEMM gives gemm_mma16_bf16's (or gemm_mma8_bf16's) bits: every token-tile count that
    fits, with as many clusters as fit the GPU, with one, and with three (several rounds of units a warp); K = 64
    leaves two of the four K-quarters without steps."""
    from decoder_service.engines.cuda.gemm_cluster import CLUSTER_TILES, cluster_grid, cluster_plan_tiles

    kernel, tokens, shared = _gemm_mma_form(dev, k_in)
    _, (wb, xb, bb, rb) = _gemm_operands(dev, rng, m, n_out, k_in)
    out = dev.poisoned(m * n_out)
    dev.launch(
        kernel,
        (-(-m // tokens), -(-n_out // 64), 1),
        (256, 1, 1),
        _gemm_args(xb, wb, bb, rb, out, m, n_out, k_in),
        shared,
    )
    want = dev.get(out, F32, (m, n_out))
    ran = 0
    for plan in filter(None, (cluster_plan_tiles(t, k_in) for t in CLUSTER_TILES)):
        cluster = dev.module.kernel(plan.kernel)
        cluster.set_max_dynamic_shared(plan.shared)
        most = cluster.max_active_clusters((1, 4, 1), (256, 1, 1), plan.shared)
        for clusters in sorted({most, 1, 3}):
            grid = cluster_grid(m, n_out, plan.tokens, clusters * -(-m // plan.tokens))
            out = dev.poisoned(m * n_out)
            args = [*_gemm_args(xb, wb, bb, rb, out, m, n_out, k_in), ("i32", plan.depth)]
            dev.launch(plan.kernel, grid, (256, 1, 1), args, plan.shared)
            same = np.array_equal(dev.get(out, F32, (m, n_out)).view(np.uint32), want.view(np.uint32))
            record("kernel", f"{plan.kernel}/bit-identical/{m}x{n_out}x{k_in}/clusters{grid[1] // 4}", exact=same)
            assert same, f"{plan.kernel} with {grid[1] // 4} clusters differs from {kernel}"
            ran += 1
    assert ran >= 3


@pytest.mark.parametrize(("m", "n_out", "k_in"), [(37, 520, 6144), (13, 300, 4096), (70, 200, 5120), (1, 64, 6144)])
def test_gemm_mma16h(dev: Device, rng: np.random.Generator, m: int, n_out: int, k_in: int) -> None:
    """gemm_mma16h_bf16 (16 tokens, each K-quarter staged in two phases) gives gemm_mma8_bf16's bits, at two grids
    (several row groups a block: phase 0 staged again for each)."""
    from decoder_service.engines.cuda.forward import gemm_mma_halves_shared

    kernel, tokens, shared = _gemm_mma_form(dev, k_in)
    assert (kernel, tokens) == ("gemm_mma8_bf16", 8)
    _, (wb, xb, bb, rb) = _gemm_operands(dev, rng, m, n_out, k_in)
    halves = gemm_mma_halves_shared(k_in)
    dev.module.kernel("gemm_mma16h_bf16").set_max_dynamic_shared(halves)
    groups = -(-n_out // 64)
    outs = {}
    for name, per_block, room in ((kernel, 8, shared), ("gemm_mma16h_bf16", 16, halves)):
        for row_blocks in (groups, max(1, groups // 3)):
            out = dev.poisoned(m * n_out)
            args = _gemm_args(xb, wb, bb, rb, out, m, n_out, k_in)
            dev.launch(name, (-(-m // per_block), row_blocks, 1), (256, 1, 1), args, room)
            outs[name, row_blocks] = dev.get(out, F32, (m, n_out)).view(np.uint32)
    want = outs[kernel, groups]
    for (name, row_blocks), got in outs.items():
        same = np.array_equal(got, want)
        record("kernel", f"{name}/bit-identical/{m}x{n_out}x{k_in}/rows{row_blocks}", exact=same)
        assert same, f"{name} at {row_blocks} row blocks differs from {kernel}"


def rope_table(dev: Device, positions: int, hd: int, theta: float) -> DeviceBuffer:
    """The rotary cosines and sines of positions 0 .. positions - 1, made by the rope_table kernel."""
    table = dev.poisoned(positions * hd)
    dev.launch(
        "rope_table", (positions, 1, 1), (max(32, hd // 2), 1, 1), [("ptr", table.ptr), ("i32", hd), ("f32", theta)]
    )
    return table


@pytest.mark.parametrize(("hd", "theta"), [(16, 1e4), (64, 1e4), (128, 1e6), (256, 1e6)])
def test_rope_table(dev: Device, hd: int, theta: float) -> None:
    positions = 4096
    table = dev.get(rope_table(dev, positions, hd, theta), F32, (positions, hd))
    check(f"rope_table/hd={hd},theta={theta:g}", table, ref.rope_table(positions, hd, theta))


@pytest.mark.parametrize(
    ("hd", "qk_norm", "device_pos"), [(64, True, False), (128, True, True), (128, False, False), (64, False, True)]
)
def test_qk_norm_rope_cache(dev: Device, rng: np.random.Generator, hd: int, qk_norm: bool, device_pos: bool) -> None:
    t, heads, kv, pos0, theta, eps, ctx = 3, 4, 2, 1000, 1e6, 1e-6, 1100
    width = (heads + 2 * kv) * hd
    qkv = rng.standard_normal((t, width)).astype(F32)
    qnb, qn = bf16_random(rng, hd, 0.2, 1.0)
    knb, kn = bf16_random(rng, hd, 0.2, 1.0)
    qkv_b, kc, vc = dev.put(qkv), dev.poisoned_kv(ctx * kv * hd), dev.poisoned_kv(ctx * kv * hd)
    qn_ptr = dev.put(qnb).ptr if qk_norm else 0
    kn_ptr = dev.put(knb).ptr if qk_norm else 0
    pos_ptr = dev.put(np.array([pos0], dtype=np.int32)).ptr if device_pos else 0
    table = rope_table(dev, ctx, hd, theta)
    dev.launch(
        "qk_norm_rope_cache",
        (t, heads + kv, 1),
        (hd, 1, 1),
        [
            ("ptr", qkv_b.ptr),
            ("ptr", qn_ptr),
            ("ptr", kn_ptr),
            ("ptr", kc.ptr),
            ("ptr", vc.ptr),
            ("ptr", pos_ptr),
            ("i32", -1 if device_pos else pos0),
            ("i32", heads),
            ("i32", kv),
            ("i32", hd),
            ("ptr", table.ptr),
            ("f32", eps),
        ],
    )
    truth = ref.rope_table(ctx, hd, theta)
    q, k, _ = ref.qk_norm_rope(qkv, qn if qk_norm else None, kn if qk_norm else None, pos0, heads, kv, hd, truth, eps)
    tag = f"hd={hd},norm={qk_norm},device_pos={device_pos}"
    out_qkv = dev.get(qkv_b, F32, (t, width))
    check(f"qk_norm_rope/q/{tag}", out_qkv[:, : heads * hd], q.reshape(t, -1))
    np.testing.assert_array_equal(out_qkv[:, heads * hd :], qkv[:, heads * hd :])  # k and v stay put in qkv
    # The cache rows: bf16, so within its rounding of the float64 values; v is copied, so exactly its rounding.
    check(f"qk_norm_rope/k_cache/{tag}", dev.get_kv(kc, (ctx, kv, hd))[pos0 : pos0 + t], k)
    v_bits = dev.get(vc, np.uint16, (ctx, kv, hd))[pos0 : pos0 + t]
    np.testing.assert_array_equal(v_bits, to_bf16_bits(qkv[:, (heads + kv) * hd :].reshape(t, kv, hd)))


@pytest.mark.parametrize(
    ("hd", "t", "pos0", "device_pos"), [(64, 5, 37, False), (128, 1, 200, True), (128, 70, 0, False), (64, 1, 0, False)]
)
def test_attention(dev: Device, rng: np.random.Generator, hd: int, t: int, pos0: int, device_pos: bool) -> None:
    heads, kv, ctx = 8, 2, 512
    width = (heads + 2 * kv) * hd
    qkv = rng.standard_normal((t, width)).astype(F32)
    (k_bits, k_cache), (v_bits, v_cache) = bf16_random(rng, (ctx, kv, hd)), bf16_random(rng, (ctx, kv, hd))
    qb, kb, vb, out = dev.put(qkv), dev.put(k_bits), dev.put(v_bits), dev.poisoned(t * heads * hd)
    pos_ptr = dev.put(np.array([pos0], dtype=np.int32)).ptr if device_pos else 0
    dev.launch(
        "attention",
        (heads, t, 1),
        (128, 1, 1),
        [
            ("ptr", qb.ptr),
            ("ptr", kb.ptr),
            ("ptr", vb.ptr),
            ("ptr", out.ptr),
            ("ptr", pos_ptr),
            ("i32", -1 if device_pos else pos0),
            ("i32", heads),
            ("i32", kv),
            ("i32", hd),
            ("f32", hd**-0.5),
        ],
        shared=ctx * 4,
    )
    q = qkv[:, : heads * hd].reshape(t, heads, hd).astype(np.float64)
    expected = ref.attention(q, k_cache, v_cache, pos0)
    check(f"attention/hd={hd},t={t},pos0={pos0}", dev.get(out, F32, (t, heads * hd)), expected)


@pytest.mark.parametrize(
    ("hd", "heads", "kv", "t", "pos0", "per_block", "device_pos"),
    [
        (128, 16, 8, 36, 700, 2, False),  # Qwen3-1.7B's heads: a request suffix after a prefix of three tiles
        (128, 16, 8, 37, 250, 4, True),  # the last block short of tokens; a tile boundary inside a block
        (128, 8, 2, 70, 0, 2, False),  # a prompt's first chunk: every query's context starts at 0
        (64, 9, 3, 36, 300, 2, False),  # SmolLM2's heads: groups of 3, six queries a block
        (64, 8, 1, 3, 511, 1, True),  # a group of 8 fills a block with one token
    ],
)
def test_grouped_prefill_attention_on_the_tensor_cores(
    dev: Device,
    rng: np.random.Generator,
    hd: int,
    heads: int,
    kv: int,
    t: int,
    pos0: int,
    per_block: int,
    device_pos: bool,
) -> None:
    """attention_prefill_hd* (a block per kv head and group of tokens, every query of the group at once, products on
    the tensor cores with the queries and weights split into bf16 hi and lo terms) stays within MMA_TOL of
    float64, and a query's bits depend on its own row alone: the same with one token a block and with the position
    read from the host or from device memory."""
    ctx = 1024
    width = (heads + 2 * kv) * hd
    qkv = rng.standard_normal((t, width)).astype(F32)
    (k_bits, k_cache), (v_bits, v_cache) = bf16_random(rng, (ctx, kv, hd)), bf16_random(rng, (ctx, kv, hd))
    qb, kb, vb = dev.put(qkv), dev.put(k_bits), dev.put(v_bits)
    pos_ptr = dev.put(np.array([pos0], dtype=np.int32)).ptr
    kernel = prefill_attention_kernel(hd, heads // kv)
    assert kernel == f"attention_prefill_hd{hd}"
    tile = prefill_attention_shared(hd)
    dev.module.kernel(kernel).set_max_dynamic_shared(tile)

    buffers = [("ptr", qb.ptr), ("ptr", kb.ptr), ("ptr", vb.ptr)]
    shape = [("i32", heads), ("i32", kv), ("f32", hd**-0.5)]

    def run(tokens_per_block: int, from_device: bool) -> np.ndarray:
        out = dev.poisoned(t * heads * hd)
        where = [("ptr", pos_ptr), ("i32", -1)] if from_device else [("ptr", 0), ("i32", pos0)]
        dev.launch(
            kernel,
            (kv, -(-t // tokens_per_block), 1),
            (ATTN_THREADS, 1, 1),
            [*buffers, ("ptr", out.ptr), *where, ("i32", t), ("i32", tokens_per_block), *shape],
            shared=tile,
        )
        return dev.get(out, F32, (t, heads * hd))

    got = run(per_block, device_pos)
    for other in (run(1, device_pos), run(per_block, not device_pos)):
        np.testing.assert_array_equal(got.view(np.uint32), other.view(np.uint32))
    q = qkv[:, : heads * hd].reshape(t, heads, hd).astype(np.float64)
    expected = ref.attention(q, k_cache, v_cache, pos0)
    name = f"attention_prefill/hd={hd},t={t},pos0={pos0}"
    check(name, got, expected)
    assert ref.rel_err(got, expected) <= MMA_TOL, name


def _decode_attention_args(
    buffers: dict[str, int], pos: tuple[str, int], heads: int, kv: int, hd: int, table: int, eps: float, chunks: int
) -> list[tuple[str, object]]:
    """attention_decode*'s arguments (pos: ("i32", a host position) or, for the chain forms, ("ptr", the count))."""
    names = ("qkv", "q_norm", "k_norm", "k", "v", "partial", "out", "done", "pos")
    return [
        *[("ptr", buffers[n]) for n in names],
        pos,
        ("i32", heads),
        ("i32", kv),
        ("i32", hd),
        ("f32", hd**-0.5),
        ("ptr", table),
        ("f32", eps),
        ("i32", chunks),
    ]


def _chain_rows_args(
    buffers: dict[str, int], heads: int, kv: int, hd: int, table: int, eps: float
) -> list[tuple[str, object]]:
    """attention_chain_rows' arguments (buffers: qkv, k_norm, k, v, pos and count)."""
    names = ("qkv", "k_norm", "k", "v", "pos", "count")
    return [
        *[("ptr", buffers[n]) for n in names],
        ("i32", heads),
        ("i32", kv),
        ("i32", hd),
        ("ptr", table),
        ("f32", eps),
    ]


@pytest.mark.parametrize(
    ("hd", "pos0", "device_pos", "qk_norm"),
    [
        (128, 200, True, True),
        (64, 0, False, True),
        (16, 1500, False, False),
        (128, 2047, True, True),
        (128, 63, True, True),
        (128, 64, True, False),  # row pos alone in its chunk: the rows past it load the chunk's first row
        (64, 200, True, True),  # head_dim 64 (SmolLM2): within the cluster merge, then past it
        (64, 1100, False, True),
        (256, 100, False, True),  # two rounds of V loads per chunk
    ],
)
def test_decode_attention(
    dev: Device, rng: np.random.Generator, hd: int, pos0: int, device_pos: bool, qk_norm: bool
) -> None:
    """The one-launch decode attention against float64; bit-identical whatever the number of blocks per head and
    whether the merge runs in a cluster (attention_decode_cluster, up to 8 chunks) or through global records (also
    in the short form, attention_decode_short, up to ATTN_MERGE_SPLIT chunks);
    the cache row it writes is bit-identical to the prefill kernel's; the merge counters are left at zero."""
    heads, kv, ctx, theta, eps = 8, 2, 2048, 1e6, 1e-6
    chunks = ctx // ATTN_CHUNK
    width = (heads + 2 * kv) * hd
    qkv = rng.standard_normal(width).astype(F32)
    qnb, qn = bf16_random(rng, hd, 0.2, 1.0)
    knb, kn = bf16_random(rng, hd, 0.2, 1.0)
    qn_ptr = dev.put(qnb).ptr if qk_norm else 0
    kn_ptr = dev.put(knb).ptr if qk_norm else 0
    (k_bits, k_cache), (v_bits, v_cache) = bf16_random(rng, (ctx, kv, hd)), bf16_random(rng, (ctx, kv, hd))
    qb = dev.put(qkv)
    part, done = dev.poisoned(heads * chunks * (hd + 2)), dev.put(np.zeros(heads, dtype=np.int32))
    pos_ptr = dev.put(np.array([pos0], dtype=np.int32)).ptr if device_pos else 0
    host_pos = -1 if device_pos else pos0
    table = rope_table(dev, ctx, hd, theta)
    outs, caches = [], []
    # attention_decode_cluster merges contexts of up to 8 chunks inside a cluster (grids of whole clusters of 8)
    runs = [
        ("attention_decode", 16),
        ("attention_decode", 3),
        ("attention_decode_cluster", 16),
        ("attention_decode_cluster", 8),
    ]
    if hd in ATTN_COMPILED_HEAD_DIMS:  # compiled for this head_dim
        runs += [(f"attention_decode_hd{hd}", 16), (f"attention_decode_hd{hd}", 3)]
        runs.append((f"attention_decode_cluster_hd{hd}", 8))
        if pos0 < SHORT_ATTENTION_POSITIONS:  # at most ATTN_MERGE_SPLIT chunks
            runs += [(f"attention_decode_short_hd{hd}", 16), (f"attention_decode_short_hd{hd}", 3)]
    for kernel, blocks in runs:
        kb, vb, out = dev.put(k_bits), dev.put(v_bits), dev.poisoned(heads * hd)
        bufs = {"qkv": qb.ptr, "q_norm": qn_ptr, "k_norm": kn_ptr, "k": kb.ptr, "v": vb.ptr}
        bufs |= {"partial": part.ptr, "out": out.ptr, "done": done.ptr, "pos": pos_ptr}
        args = _decode_attention_args(bufs, ("i32", host_pos), heads, kv, hd, table.ptr, eps, chunks)
        dev.launch(kernel, (heads, blocks, 1), (256, 1, 1), args)
        outs.append(dev.get(out, F32, heads * hd))
        caches.append((dev.get(kb, np.uint16, (ctx, kv, hd)), dev.get(vb, np.uint16, (ctx, kv, hd))))
        assert not dev.get(done, np.int32, heads).any(), "the merge counters must be left at zero"
    q, k, v = ref.qk_norm_rope(
        qkv.reshape(1, -1),
        qn if qk_norm else None,
        kn if qk_norm else None,
        pos0,
        heads,
        kv,
        hd,
        ref.rope_table(ctx, hd, theta),
        eps,
    )
    # The new token attends over its own k and v as the bf16 cache holds them.
    expected_k, expected_v = k_cache.copy(), v_cache.copy()
    expected_k[pos0], expected_v[pos0] = round_to_bf16(k[0].astype(F32)), round_to_bf16(v[0].astype(F32))
    tag = f"hd={hd},pos0={pos0}"
    check(f"attention_decode/{tag}", outs[0], ref.attention(q, expected_k, expected_v, pos0).ravel())
    check(f"attention_decode/k_row/{tag}", bf16_bits_to_float32(caches[0][0][pos0]), k[0])
    assert all(np.array_equal(outs[0], o) for o in outs[1:]), "the grid or the merge changed the bits"
    assert all(np.array_equal(a, b) for c in caches[1:] for a, b in zip(caches[0], c, strict=True))
    untouched = np.arange(ctx) != pos0
    assert np.array_equal(caches[0][0][untouched], k_bits[untouched])
    assert np.array_equal(caches[0][1][pos0], to_bf16_bits(qkv[(heads + kv) * hd :].reshape(kv, hd)))
    # The prefill kernel writes the same row bit for bit (both call head_norm_rope).
    kp, vp = dev.poisoned_kv(ctx * kv * hd), dev.poisoned_kv(ctx * kv * hd)
    dev.launch(
        "qk_norm_rope_cache",
        (1, heads + kv, 1),
        (max(32, hd), 1, 1),
        [
            ("ptr", dev.put(qkv).ptr),
            ("ptr", qn_ptr),
            ("ptr", kn_ptr),
            ("ptr", kp.ptr),
            ("ptr", vp.ptr),
            ("ptr", 0),
            ("i32", pos0),
            ("i32", heads),
            ("i32", kv),
            ("i32", hd),
            ("ptr", table.ptr),
            ("f32", eps),
        ],
    )
    assert np.array_equal(dev.get(kp, np.uint16, (ctx, kv, hd))[pos0], caches[0][0][pos0])


@pytest.mark.parametrize(
    ("hd", "pos0", "count"), [(128, 700, 4), (128, 100, 3), (128, 1500, 3), (64, 1500, 2), (64, 150, 3), (16, 60, 4)]
)
def test_decode_attention_chain_gives_each_token_a_single_steps_bits(
    dev: Device, rng: np.random.Generator, hd: int, pos0: int, count: int
) -> None:
    """A forced chain's attention (attention_chain_rows, then attention_decode_chain*) gives token t the bits of
    attention_decode at position pos0 + t after the tokens before it, whatever the blocks a head the chain shares
    out among its tokens, and the same cache rows; the merge counters are left at zero."""
    heads, kv, ctx, tokens = 8, 2, 2048, 4  # a chain launch's grid always spans CHAIN_TOKENS tokens
    chunks, width = ctx // ATTN_CHUNK, (heads + 2 * kv) * hd
    qkv = rng.standard_normal((count, width)).astype(F32)
    qn, kn = dev.put(bf16_random(rng, hd, 0.2, 1.0)[0]), dev.put(bf16_random(rng, hd, 0.2, 1.0)[0])
    k_cache, v_cache = bf16_random(rng, (ctx, kv, hd))[0], bf16_random(rng, (ctx, kv, hd))[0]  # bf16 bits
    table = rope_table(dev, ctx, hd, 1e6).ptr
    done = dev.put(np.zeros(tokens * heads, dtype=np.int32))
    part = dev.poisoned(tokens * heads * chunks * (hd + 2))

    # The reference: a decode step per token, in order, on one cache.
    kb, vb = dev.put(k_cache), dev.put(v_cache)
    want = []
    for t in range(count):
        out = dev.poisoned(heads * hd)
        bufs = {"qkv": dev.put(qkv[t]).ptr, "q_norm": qn.ptr, "k_norm": kn.ptr, "k": kb.ptr, "v": vb.ptr}
        bufs |= {"partial": part.ptr, "out": out.ptr, "done": done.ptr, "pos": 0}
        dev.launch(
            "attention_decode",
            (heads, 16, 1),
            (256, 1, 1),
            _decode_attention_args(bufs, ("i32", pos0 + t), heads, kv, hd, table, 1e-6, chunks),
        )
        want.append(dev.get(out, F32, heads * hd))
    want_k, want_v = dev.get(kb, np.uint16, (ctx, kv, hd)), dev.get(vb, np.uint16, (ctx, kv, hd))

    runs = [("attention_decode_chain", 24), ("attention_decode_chain", 96), ("attention_decode_chain", 5)]
    if pos0 + count <= 8 * ATTN_CHUNK:  # the cluster merge holds up to 8 chunks
        runs.append(("attention_decode_chain_cluster", 8))
    if hd in ATTN_COMPILED_HEAD_DIMS:
        runs += [(f"{kernel}_hd{hd}", blocks) for kernel, blocks in runs]
    pos_ptr = dev.put(np.array([pos0], dtype=np.int32)).ptr
    count_ptr = dev.put(np.array([count], dtype=np.int32)).ptr
    qkv_b = dev.put(qkv).ptr
    for kernel, blocks in runs:
        kb, vb, out = dev.put(k_cache), dev.put(v_cache), dev.poisoned(tokens * heads * hd)
        rows_bufs = {"qkv": qkv_b, "k_norm": kn.ptr, "k": kb.ptr, "v": vb.ptr, "pos": pos_ptr, "count": count_ptr}
        dev.launch(
            "attention_chain_rows",
            (tokens, kv, 1),
            (max(32, hd), 1, 1),
            _chain_rows_args(rows_bufs, heads, kv, hd, table, 1e-6),
        )
        bufs = {"qkv": qkv_b, "q_norm": qn.ptr, "k_norm": kn.ptr, "k": kb.ptr, "v": vb.ptr}
        bufs |= {"partial": part.ptr, "out": out.ptr, "done": done.ptr, "pos": pos_ptr}
        dev.launch(
            kernel,
            (heads, blocks, tokens),
            (256, 1, 1),
            _decode_attention_args(bufs, ("ptr", count_ptr), heads, kv, hd, table, 1e-6, chunks),
        )
        got = dev.get(out, F32, (tokens, heads * hd))
        for t in range(count):
            assert np.array_equal(got[t], want[t]), f"{kernel} on {blocks} blocks a head: token {t} differs"
        assert np.array_equal(dev.get(kb, np.uint16, (ctx, kv, hd)), want_k), f"{kernel}: K cache differs"
        assert np.array_equal(dev.get(vb, np.uint16, (ctx, kv, hd)), want_v), f"{kernel}: V cache differs"
        assert not dev.get(done, np.int32, tokens * heads).any(), "the merge counters must be left at zero"


def test_swiglu_and_residual_add(dev: Device, rng: np.random.Generator) -> None:
    t, inter = 3, 1536
    gu = (3.0 * rng.standard_normal((t, 2 * inter))).astype(F32)
    gb, out = dev.put(gu), dev.poisoned(t * inter)
    dev.launch("swiglu", (18, 1, 1), (256, 1, 1), [("ptr", gb.ptr), ("ptr", out.ptr), ("i32", t), ("i32", inter)])
    check("swiglu", dev.get(out, F32, (t, inter)), ref.swiglu(gu))
    a, b = rng.standard_normal(10_001).astype(F32), rng.standard_normal(10_001).astype(F32)
    ab, bb = dev.put(a), dev.put(b)
    dev.launch(
        "residual_add", (8, 1, 1), (256, 1, 1), [("ptr", ab.ptr), ("ptr", bb.ptr), ("ptr", ab.ptr), ("i32", a.size)]
    )
    check("residual_add", dev.get(ab, F32, a.size), a.astype(np.float64) + b)


@pytest.mark.parametrize("n", [1000, 151_936])
def test_argmax_ties_to_lower_id(dev: Device, rng: np.random.Generator, n: int) -> None:
    logits = rng.standard_normal(n).astype(F32)
    cases = {"random": logits.copy()}
    for name, ids in {"same-thread": [5 + 1024 * (n // 2048), 5], "cross-thread": [n - 1, 700, 7]}.items():
        tied = logits.copy()
        tied[ids] = 10.0
        cases[name] = tied
    nan = logits.copy()
    nan[::3] = np.nan
    cases["nan-ignored"] = nan
    for name, values in cases.items():
        lb, out = dev.put(values), dev.poisoned(1)
        dev.launch("argmax", (1, 1, 1), (1024, 1, 1), [("ptr", lb.ptr), ("i32", n), ("ptr", out.ptr)])
        got = int(dev.get(out, np.int32, 1)[0])
        expected = ref.argmax(np.where(np.isnan(values), -np.inf, values))
        record("kernel", f"argmax/{n}/{name}", exact=got == expected)
        assert got == expected, f"argmax {name}: got {got}, expected {expected}"
