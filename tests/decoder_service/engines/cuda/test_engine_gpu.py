"""The CUDA engine on the GPU: the bit-identity gates, parity with the CPU reference engine, and the
engine-agnostic contract suite.

Gates (every token and every logit bit of the answer compared through the step trace):
  1 graph loop == host loop          2 sparse head == dense head        3 constant trie == global trie
  4 repeated runs identical          5 canary grammar, then the product grammar re-bound: identical to before
  6 graph replays across a grammar switch use the new trie                7 an empty-mask grammar fails loudly
  8 programmatic dependent launches (the default on sm_90) == plain launches
  9 the persistent decode kernel (opt-in) == the layered launch list (the default), in both loops
 10 decode attention merged in thread-block clusters (the default for requests within 256 positions, as these
    are) == merged through global records and a counter, in both loops
 11 the forced tail taken without forward passes (the default) == a forward pass after every token, in both loops
    (the tail's step-log rows carry no logit; tokens, log-probs and pointers are compared)
 12 forced chains through one forward pass (the default) == a forward pass per token, in both loops (as gate 11)
 13 the FP8 weight format (single-token GEMVs on e4m3 bytes) == the bf16 format, on the same quantized weights,
    in both loops
 14 the short decode attention (the default within 1,024 positions past the cluster form's) == the global form, on
    SmolLM2's shape (head_dim 64) after a 700-token prefix, in both loops
Every engine runs the product's defaults but for the one setting its gate varies.
Models are synthetic (fixed seeds, generated here); catalogs are explicit token sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from decoder_service.engines.base import DecodeError, Engine, PointerEvent
from decoder_service.models.config import ModelConfig
from decoder_service.models.synth import PRESETS, synthetic_weights
from tests.decoder_service.engines.cuda.gpu_harness import record, requires_gpu
from tests.decoder_service.engines.cuda.synthetic_tries import empty_mask_trie, random_catalog, wide_catalog
from tests.decoder_service.engines.test_engine_contract import (  # noqa: F401  (collected here on the GPU)
    test_a_prompt_and_answer_past_the_context_are_refused,
    test_allowed_subset_narrows_the_answer,
    test_forced_chains_take_the_same_answer_in_fewer_passes,
    test_forced_tail_takes_the_same_answer_without_its_forward_passes,
    test_greedy_choice_and_score_against_fresh_forward,
    test_k_above_catalog_and_bad_intents_are_refused,
    test_k_distinct_catalog_names,
    test_prefix_kv_is_reused_per_catalog,
    test_sparse_and_dense_heads_choose_identically,
)

pytestmark = requires_gpu
NEAR_TIE = 0.05
SEP, STOP = 11, 12
N_GATE_INTENTS = 20
N_PARITY_INTENTS = 50
EMBED_SCALE = 4.0


def _weights(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    return dict(synthetic_weights(cfg, seed))


def _intents(n: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(200, vocab, int(rng.integers(4, 12))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def qwen3_tiny() -> tuple[ModelConfig, dict[str, np.ndarray]]:
    cfg = PRESETS["tiny"]
    return cfg, _weights(cfg, 7)


@pytest.fixture(scope="module")
def engines(qwen3_tiny) -> Iterator[Callable[..., Engine]]:
    from decoder_service.engines.cuda.engine import CudaEngine, load_module

    made: dict[tuple, CudaEngine] = {}

    def get(
        head: str = "sparse",
        loop: str = "graph",
        placement: str = "auto",
        pdl: bool | None = None,
        decode_kernel: str | None = None,
        cluster_attention: bool | None = None,
        forced_tail: bool | None = None,
        forced_chains: bool | None = None,
    ) -> CudaEngine:
        key = (head, loop, placement, pdl, decode_kernel, cluster_attention, forced_tail, forced_chains)
        if key not in made:
            made[key] = CudaEngine(
                *qwen3_tiny,
                head=head,
                loop=loop,
                trie_placement=placement,
                max_context=512,
                module=load_module(pdl=pdl),
                decode_kernel=decode_kernel,
                cluster_attention=cluster_attention,
                forced_tail=forced_tail,
                forced_chains=forced_chains,
            )
        return made[key]

    yield get
    for engine in made.values():
        engine.free()


@pytest.fixture(scope="module")
def product_trie():
    return random_catalog(np.random.default_rng(3), 40, PRESETS["tiny"].vocab_size, SEP, STOP)


@pytest.fixture(scope="module")
def canary_trie():
    return random_catalog(np.random.default_rng(4), 12, PRESETS["tiny"].vocab_size, SEP, STOP, first_tokens=4)


PREFIX = list(range(300, 340))


def _answer(
    engine, trie, intent: list[int], k: int = 4, key: str = "prefix", prefix: list[int] = PREFIX
) -> tuple[list, np.ndarray]:
    events = list(engine.decode_ids(trie, k, prefix, intent, cache_key=key))
    pointers = [(e.pointer_id, e.token_ids, e.score) for e in events if isinstance(e, PointerEvent)]
    return pointers, engine.read_trace().copy()


def _answers(engine, trie, intents) -> list[tuple[list, np.ndarray]]:
    return [_answer(engine, trie, i) for i in intents]


def _same(a: list[tuple[list, np.ndarray]], b: list[tuple[list, np.ndarray]]) -> bool:
    return all(pa == pb and np.array_equal(ta, tb) for (pa, ta), (pb, tb) in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def reference_answers(engines, product_trie) -> list[tuple[list, np.ndarray]]:
    intents = _intents(N_GATE_INTENTS, PRESETS["tiny"].vocab_size, 11)
    return _answers(engines("sparse", "host"), product_trie, intents)


def _gate(name: str, ok: bool, **extra) -> None:
    record("gate", name, identical=ok, **extra)
    assert ok, name


def test_gate1_graph_loop_equals_host_loop(engines, product_trie, reference_answers) -> None:
    intents = _intents(N_GATE_INTENTS, PRESETS["tiny"].vocab_size, 11)
    graph = _answers(engines("sparse", "graph"), product_trie, intents)
    from decoder_service.engines.cuda.memory import MappedHostBuffer

    tokens = sum(len(t) for _, t in graph)
    mapped = isinstance(engines("sparse", "graph").state.out, MappedHostBuffer)
    _gate(
        "1 graph loop == host loop",
        _same(graph, reference_answers),
        intents=len(intents),
        tokens=tokens,
        output="mapped host memory" if mapped else "polled device buffer",
    )


def test_gate2_sparse_head_equals_dense_head(engines, product_trie, reference_answers) -> None:
    intents = _intents(N_GATE_INTENTS, PRESETS["tiny"].vocab_size, 11)
    dense = _answers(engines("dense", "graph"), product_trie, intents)
    _gate("2 sparse head == dense head", _same(dense, reference_answers), intents=len(intents))


def test_gate3_constant_trie_equals_global_trie(engines, product_trie, reference_answers) -> None:
    intents = _intents(N_GATE_INTENTS, PRESETS["tiny"].vocab_size, 11)
    constant = engines("sparse", "graph", "constant")
    glob = engines("sparse", "graph", "global")
    a, b = _answers(constant, product_trie, intents), _answers(glob, product_trie, intents)
    assert constant._tries[id(product_trie)].constant and not glob._tries[id(product_trie)].constant
    _gate("3 constant trie == global trie", _same(a, reference_answers) and _same(b, reference_answers))


def test_gate4_repeated_runs(engines, product_trie, reference_answers) -> None:
    intents = _intents(N_GATE_INTENTS, PRESETS["tiny"].vocab_size, 11)
    engine = engines("sparse", "graph")
    runs = [_answers(engine, product_trie, intents) for _ in range(2)]
    _gate("4 repeated runs", _same(runs[0], reference_answers) and _same(runs[1], reference_answers))


def test_gate5_and_6_grammar_switch(engines, product_trie, canary_trie, reference_answers) -> None:
    intents = _intents(N_GATE_INTENTS, PRESETS["tiny"].vocab_size, 11)
    engine = engines("sparse", "graph")
    before = _answers(engine, product_trie, intents[:5])
    canary = _answers(engine, canary_trie, intents[:5])  # same graph, new trie in the constant bank
    after = _answers(engine, product_trie, intents[:5])
    canary_host = _answers(engines("sparse", "host"), canary_trie, intents[:5])
    canary_names = {canary_trie.names[p] for ps, _ in canary for p, _, _ in ps}
    _gate("5 canary then product re-bound", _same(before, after) and _same(after, reference_answers[:5]))
    _gate("6 graph replays use the new trie", _same(canary, canary_host) and canary_names <= set(canary_trie.names))


def test_gate7_empty_mask_fails_loudly(engines) -> None:
    for loop in ("graph", "host"):
        with pytest.raises(DecodeError, match="empty mask"):
            list(engines("sparse", loop).decode_ids(empty_mask_trie(SEP, STOP), 1, PREFIX, [500, 501]))
    record("gate", "7 empty mask fails loudly", identical=True)


def test_gate8_programmatic_launch_equals_plain_launch(engines, product_trie, reference_answers) -> None:
    from decoder_service.engines.cuda.module import pdl_default

    intents = _intents(N_GATE_INTENTS, PRESETS["tiny"].vocab_size, 11)
    plain = _answers(engines("sparse", "graph", pdl=False), product_trie, intents)
    assert not engines("sparse", "graph", pdl=False).module.pdl
    _gate(
        "8 programmatic dependent launch == plain launch",
        _same(plain, reference_answers),
        reference="PDL on" if pdl_default() else "PDL off (device or TOOLTRIE_CUDA_PDL=0)",
    )


def test_gate9_persistent_decode_kernel_equals_layered_kernels(engines, product_trie) -> None:
    intents = _intents(N_GATE_INTENTS, PRESETS["tiny"].vocab_size, 11)
    persistent = {loop: engines("sparse", loop, decode_kernel="persistent") for loop in ("graph", "host")}
    # The persistent kernel takes no forced chains: the layered reference runs a pass per token too.
    layered = engines("sparse", "host", forced_chains=False)
    assert layered.model.decode_kernel == "layers" and not layered.chains
    assert all(engine.model.decode_kernel == "persistent" and not engine.chains for engine in persistent.values())
    reference = _answers(layered, product_trie, intents)
    _gate(
        "9 persistent decode kernel == layered kernels",
        all(_same(_answers(engine, product_trie, intents), reference) for engine in persistent.values()),
        loops="graph and host",
    )


def test_gate10_cluster_attention_equals_global_merge(engines, product_trie, reference_answers) -> None:
    intents = _intents(N_GATE_INTENTS, PRESETS["tiny"].vocab_size, 11)
    # (loop, dense head, attention form, chains): the reference's short requests took the cluster kernel
    assert ("host", False, "cluster", True) in engines("sparse", "host")._drivers
    merged = {loop: engines("sparse", loop, cluster_attention=False) for loop in ("graph", "host")}
    answers = {loop: _answers(engine, product_trie, intents) for loop, engine in merged.items()}
    assert all(key[2] == "global" for engine in merged.values() for key in engine._drivers)  # head_dim 16: no short
    _gate(
        "10 cluster attention merge == global merge",
        all(_same(a, reference_answers) for a in answers.values()),
        loops="graph and host",
    )


def test_gate11_forced_tail_equals_a_forward_pass_per_token(engines, product_trie) -> None:
    intents = _intents(N_GATE_INTENTS, PRESETS["tiny"].vocab_size, 11)
    # without chains, which would take a short tail as a chain of their own
    tail = _answers(engines("sparse", "host", forced_chains=False), product_trie, intents)
    ok, taken = _same_but_unscored(tail, engines, product_trie, forced_tail=False, forced_chains=False)
    _gate("11 forced tail without forward passes == a forward pass per token", ok, tokens_without_pass=taken)


def test_gate12_forced_chains_equal_a_forward_pass_per_token(engines, product_trie, reference_answers) -> None:
    assert engines("sparse", "host").chains  # the reference answers fed forced chains through one pass
    ok, taken = _same_but_unscored(reference_answers, engines, product_trie, forced_chains=False)
    _gate("12 forced chains in one forward pass == a forward pass per token", ok, tokens_without_pass=taken)


def _same_but_unscored(reference, engines, trie, **switches: bool) -> tuple[bool, int]:
    """Whether the engines with ``switches`` give the ``reference`` answers in both loops: the same pointers, and
    the same step log but where the reference took a token without its logits (TT_NO_LOGIT rows); and how many such
    rows the reference has beyond theirs (0 means the gate saw nothing)."""
    from decoder_service.engines.cuda.step import NO_LOGIT

    intents = _intents(N_GATE_INTENTS, PRESETS["tiny"].vocab_size, 11)
    ok, extra = True, 0
    for loop in ("graph", "host"):
        for (pointers, trace), (ref_pointers, ref_trace) in zip(
            _answers(engines("sparse", loop, **switches), trie, intents), reference, strict=True
        ):
            computed = ref_trace[:, 1] != NO_LOGIT
            ok &= pointers == ref_pointers and np.array_equal(trace[:, [0, 2]], ref_trace[:, [0, 2]])
            ok &= np.array_equal(trace[computed, 1], ref_trace[computed, 1])
            extra += int((~computed).sum() - (trace[:, 1] == NO_LOGIT).sum())
    return ok and extra > 0, extra


def test_gate13_fp8_weights_equal_bf16_weights(qwen3_tiny, product_trie) -> None:
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.models.fp8 import quantize_weights

    cfg, weights = qwen3_tiny
    quantized = quantize_weights(cfg, weights)
    intents = _intents(N_GATE_INTENTS, cfg.vocab_size, 11)
    made = [CudaEngine(cfg, quantized, loop="host", max_context=512)]
    try:
        reference = _answers(made[0], product_trie, intents)
        same = True
        for loop in ("graph", "host"):
            made.append(CudaEngine(cfg, quantized, loop=loop, max_context=512, weight_format="fp8"))
            kernels = {launch.kernel.name for launch in made[-1].model.decode_launches}
            assert {"gemv_stream_fp8", "gemv_stream_swiglu_fp8"} <= kernels  # the gate compares what it claims
            same &= _same(_answers(made[-1], product_trie, intents), reference)
    finally:
        for engine in made:
            engine.free()
    _gate("13 FP8 weight format == bf16 format on the same weights", same, loops="graph and host")


def test_gate14_short_attention_equals_global_merge() -> None:
    """attention_decode_short (no split merge compiled in) against attention_decode on SmolLM2's shape (head_dim 64),
    after a 700-token prefix: 23-24 chunks, so the serial merge's hand-over of its second batch runs."""
    from decoder_service.engines.cuda.engine import CudaEngine

    cfg = PRESETS["smollm2-shape"]
    weights = _weights(cfg, 21)
    trie = random_catalog(np.random.default_rng(8), 40, cfg.vocab_size, SEP, STOP)
    prefix, intents = list(range(300, 1000)), _intents(8, cfg.vocab_size, 11)

    def answers(engine: CudaEngine) -> list[tuple[list, np.ndarray]]:
        return [_answer(engine, trie, intent, key="long", prefix=prefix) for intent in intents]

    settings = {"max_context": 1024}  # past the cluster form's 256 positions
    made = [CudaEngine(cfg, weights, loop="host", short_attention=False, **settings)]
    try:
        reference = answers(made[0])
        assert {key[2] for key in made[0]._drivers} == {"global"}
        same = True
        for loop in ("graph", "host"):
            made.append(CudaEngine(cfg, weights, loop=loop, short_attention=True, **settings))
            same &= _same(answers(made[-1]), reference)
            assert {key[2] for key in made[-1]._drivers} == {"short"}  # the gate compares what it claims
    finally:
        for engine in made:
            engine.free()
    _gate("14 short attention (no split merge) == global merge", same, loops="graph and host")


def test_wide_node_uses_dense_head(engines) -> None:
    trie = wide_catalog(300, PRESETS["tiny"].vocab_size, SEP, STOP)
    intents = _intents(3, PRESETS["tiny"].vocab_size, 5)
    graph = _answers(engines("sparse", "graph"), trie, intents)
    host = _answers(engines("dense", "host"), trie, intents)
    _gate("wide node (300 legal tokens): dense fallback, graph == host", _same(graph, host))


# -- parity with the CPU reference engine ------------------------------------------------------------------
def _cpu_answer(model, trie, prompt: list[int], k: int) -> tuple[list[int], float]:
    """The CPU engine's loop on raw ids: pointer ids and the smallest top-2 legal margin of any step."""
    from decoder_service.engines.cpu.sampler import greedy_pick
    from tooltrie.grammar.runtime import GrammarState

    cache = model.new_cache(len(prompt) + k * (trie.longest_path + 1))
    hidden = model.prefill(prompt, cache)
    state, margin = GrammarState(trie, k), np.inf
    while not state.done:
        legal = state.legal_tokens()
        logits = model.logits_for(hidden, legal)
        if len(legal) > 1:
            top2 = np.sort(logits)[-2:]
            margin = min(margin, float(top2[1] - top2[0]))
        token, _ = greedy_pick(legal, logits)
        state.advance(token)
        if not state.done:
            hidden = model.decode(token, cache)
    return list(state.emitted), margin


@pytest.mark.parametrize("preset", ["tiny", "smollm2-shape"])
def test_pointers_match_cpu_reference(preset: str) -> None:
    from decoder_service.engines.cpu.model import CpuTransformer
    from decoder_service.engines.cuda.engine import CudaEngine

    cfg = PRESETS[preset]
    weights = _weights(cfg, 21)
    # Random 0.02-scale rows give logits of spread ~0.5, where most answers hold a step closer than the near-tie
    # margin; a 4x (tied) embedding spreads them like a trained model's (~2), so most intents are compared.
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"] * np.float32(EMBED_SCALE)
    trie = random_catalog(np.random.default_rng(8), 40, cfg.vocab_size, SEP, STOP)
    cpu = CpuTransformer(cfg, weights)
    engine = CudaEngine(cfg, weights, max_context=512)
    try:
        near, flips, compared = 0, [], 0
        for i, intent in enumerate(_intents(N_PARITY_INTENTS, cfg.vocab_size, 31)):
            prompt = PREFIX + intent
            expected, margin = _cpu_answer(cpu, trie, prompt, 3)
            got = [
                e.pointer_id
                for e in engine.decode_ids(trie, 3, PREFIX, intent, cache_key="p")
                if isinstance(e, PointerEvent)
            ]
            if margin <= NEAR_TIE:
                near += 1
                if got != expected:
                    flips.append({"intent": i, "cpu": expected, "cuda": got, "margin": margin, "near_tie": True})
                continue
            compared += 1
            if got != expected:
                flips.append({"intent": i, "cpu": expected, "cuda": got, "margin": margin, "near_tie": False})
    finally:
        engine.free()
    record("cpu_parity", preset, intents=N_PARITY_INTENTS, compared=compared, near_ties=near, flips=flips)
    assert not [f for f in flips if not f["near_tie"]], flips


# -- the engine-agnostic contract suite, on the GPU ---------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from decoder_service.models.synth import write_synthetic_checkpoint

    return write_synthetic_checkpoint("tiny", 7, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tiny_model(tiny_dir: Path):
    from decoder_service.models.loader import load_model

    return load_model(tiny_dir)


@pytest.fixture(scope="module")
def tiny_catalog(tiny_dir: Path):
    from tests.decoder_service.engines.conftest import prepare_tiny_catalog

    return prepare_tiny_catalog(tiny_dir)


@pytest.fixture
def make_tiny_engine(tiny_model) -> Iterator[Callable[..., Engine]]:
    from decoder_service.engines.cuda.engine import CudaEngine

    made = []

    def make(head: str = "sparse", forced_tail: bool = True, forced_chains: bool = True) -> Engine:
        made.append(
            CudaEngine(*tiny_model, head=head, max_context=1024, forced_tail=forced_tail, forced_chains=forced_chains)
        )
        return made[-1]

    yield make
    for engine in made:
        engine.free()
