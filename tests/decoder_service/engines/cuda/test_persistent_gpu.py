"""The persistent decode kernel (cuda/decode_persistent.cuh) on the GPU: every step's logits and every KV cache row
it writes are the layered launch list's, bit for bit, across model shapes (Qwen3 with q/k norms, Qwen2 with qkv
biases, Llama; head dims 64 and 128) and contexts from one attention task per block to several (1,000 positions of
16 heads: 512 tasks on 132 blocks), in the host-argument and the device-pointer (graph) forms of the step."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from tests.decoder_service.engines.cuda.gpu_harness import load_module, record, requires_gpu
from tests.decoder_service.engines.cuda.hf_models import SHAPES

pytestmark = requires_gpu

# (shape, prompt length, decode steps): the tiny Qwen3's steps cross the 128-position chunk boundary.
CASES = [
    ("tiny-qwen3", 100, 40),
    ("tiny-qwen2-hd128-untied", 60, 12),
    ("tiny-llama-untied", 31, 12),
    ("smollm2-shape", 90, 8),
    ("qwen3-1.7b-shape", 200, 6),
    ("qwen3-1.7b-shape", 1000, 3),
]


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    yield load_module(tmp_path_factory.mktemp("cubin"))


def _caches(model, length: int) -> list[np.ndarray]:
    width = model.kv_width
    return [buf.download(np.uint16, length * width, model.stream) for buf in (*model.k_cache, *model.v_cache)]


@pytest.mark.parametrize(("shape", "prompt_len", "steps"), CASES)
def test_persistent_step_is_the_layered_step(module, shape: str, prompt_len: int, steps: int) -> None:
    from bench.gpu_forward import synthetic_weights
    from decoder_service.engines.cuda.forward import CudaModel

    cfg = SHAPES[shape]
    weights = synthetic_weights(cfg, seed=5)
    context = prompt_len + steps + 8
    models = {
        kind: CudaModel(cfg, weights, module, max_context=context, max_prefill=512, decode_kernel=kind)
        for kind in ("layers", "persistent")
    }
    del weights
    prompt = np.random.default_rng(17).integers(0, cfg.vocab_size, prompt_len).tolist()
    try:
        assert models["persistent"].decode_kernel == "persistent"
        logits = {kind: [] for kind in models}
        for kind, model in models.items():
            model.prefill(prompt)
            for _ in range(steps):
                model.decode()  # the previous argmax, from device memory
                logits[kind].append(model.read_logits())
        same_logits = all(np.array_equal(a, b) for a, b in zip(logits["layers"], logits["persistent"], strict=True))
        length = prompt_len + steps
        same_caches = all(
            np.array_equal(a, b)
            for a, b in zip(_caches(models["layers"], length), _caches(models["persistent"], length), strict=True)
        )
        finite = all(np.isfinite(step).all() for step in logits["persistent"])
    finally:
        for model in models.values():
            model.free()
    record("kernel", f"decode_persistent/{shape}/prompt{prompt_len}/bit-identical", exact=same_logits and same_caches)
    assert finite
    assert same_logits, "the persistent step's logits differ from the layered step's"
    assert same_caches, "the persistent step wrote other KV cache rows than the layered step"


def test_persistent_step_replays_as_a_graph(module) -> None:
    """The device-pointer form (position from device memory) captured into a graph and replayed gives the host
    form's logits: the graph loop runs the step this way."""
    from bench.gpu_forward import capture, synthetic_weights
    from decoder_service.engines.cuda.driver import call
    from decoder_service.engines.cuda.forward import CudaModel
    from decoder_service.engines.cuda.memory import DeviceBuffer

    cfg = SHAPES["tiny-qwen3"]
    weights = synthetic_weights(cfg, seed=6)
    model = CudaModel(cfg, weights, module, max_context=256, max_prefill=64, decode_kernel="persistent")
    pos = DeviceBuffer(4)
    try:
        prompt = np.random.default_rng(3).integers(0, cfg.vocab_size, 50).tolist()
        model.prefill(prompt)
        first = model.read_token()
        host = []
        for _ in range(5):
            model.decode()
            host.append(model.read_logits())
        launches, _ = model._build(1, tokens_ptr=model.token.ptr, pos=0, pos_ptr=pos.ptr)
        graph = capture(model.stream, launches)
        model.token.upload(np.array([first], dtype=np.int32), model.stream)
        replayed = []
        for step in range(5):
            pos.upload(np.array([len(prompt) + step], dtype=np.int32), model.stream)
            call("cuGraphLaunch", graph, model.stream.handle)
            replayed.append(model.read_logits())
        call("cuGraphExecDestroy", graph)
    finally:
        pos.free()
        model.free()
    same = all(np.array_equal(a, b) for a, b in zip(host, replayed, strict=True))
    record("kernel", "decode_persistent/graph-replay/bit-identical", exact=same)
    assert same
