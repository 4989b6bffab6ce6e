"""The CUDA engine's host loop on the numpy stand-in for the driver, through the engine-agnostic contract suite.

No GPU needed: this checks the control block, the trie image offsets, the candidate layout, the published
records and the prefix cache plumbing. The kernels' own arithmetic is checked on the GPU (test_engine_gpu.py).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import pytest

from decoder_service.engines.base import DecodeError, Engine
from tests.decoder_service.engines.cuda.emulator import FakeDriver, install_fake_driver
from tests.decoder_service.engines.test_engine_contract import (  # noqa: F401  (collected here as well)
    test_a_prompt_and_answer_past_the_context_are_refused,
    test_allowed_subset_narrows_the_answer,
    test_forced_chains_take_the_same_answer_in_fewer_passes,
    test_forced_tail_takes_the_same_answer_without_its_forward_passes,
    test_greedy_choice_and_score_against_fresh_forward,
    test_k_distinct_catalog_names,
    test_prefix_kv_is_reused_per_catalog,
    test_sparse_and_dense_heads_choose_identically,
)


@pytest.fixture
def fake_driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    return install_fake_driver(monkeypatch, heap_bytes=256 << 20)


@pytest.fixture
def make_tiny_engine(fake_driver: FakeDriver, tiny_model) -> Callable[..., Engine]:
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.module import Module

    def make(head: str = "sparse", forced_tail: bool = True, forced_chains: bool = True) -> Engine:
        return CudaEngine(
            *tiny_model,
            head=head,
            loop="host",
            module=Module(b"cubin"),
            max_context=512,
            forced_tail=forced_tail,
            forced_chains=forced_chains,
        )

    return make


@pytest.mark.parametrize("placement", ["constant", "global"])
def test_trie_placements_decide_identically(fake_driver, tiny_model, tiny_catalog, placement: str) -> None:
    from decoder_service.engines.base import DecodeRequest
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.module import Module

    engine = CudaEngine(*tiny_model, loop="host", module=Module(b"cubin"), max_context=512, trie_placement=placement)
    events = list(engine.decode(DecodeRequest("Read the config file", 3, tiny_catalog)))
    assert engine._tries[id(tiny_catalog.trie)].constant == (placement == "constant")
    assert len({e.name for e in events[:-1]}) == 3


@pytest.mark.parametrize("loop", ["host", "graph"])
def test_engine_frees_all_it_allocated(fake_driver, tiny_model, tiny_catalog, loop: str) -> None:
    from decoder_service.engines.base import DecodeRequest
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.module import Module

    before = set(fake_driver.live), set(fake_driver.live_host)
    engine = CudaEngine(*tiny_model, loop=loop, module=Module(b"cubin"), max_context=512)
    list(engine.decode(DecodeRequest("Read the config file", 2, tiny_catalog)))
    engine.free()
    assert (fake_driver.live, fake_driver.live_host) == before, "device or host buffers outlive the engine"


def test_empty_mask_grammar_fails_loudly(fake_driver, tiny_model) -> None:
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.module import Module
    from tests.decoder_service.engines.cuda.synthetic_tries import empty_mask_trie

    engine = CudaEngine(*tiny_model, loop="host", module=Module(b"cubin"), max_context=512)
    with pytest.raises(DecodeError, match="empty mask"):
        list(engine.decode_ids(empty_mask_trie(), 1, [], [5, 6, 7]))


@pytest.mark.parametrize("loop", ["host", "graph"])
def test_cancelled_request_stops_and_the_next_one_is_unaffected(fake_driver, tiny_model, tiny_catalog, loop) -> None:
    from decoder_service.engines.base import DecodeRequest, PointerEvent, SummaryEvent
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.module import Module

    engine = CudaEngine(*tiny_model, loop=loop, module=Module(b"cubin"), max_context=512)
    request = DecodeRequest("Read the config file", 3, tiny_catalog)
    full = list(engine.decode(request))
    seen: list = []
    cancelled = DecodeRequest("Read the config file", 3, tiny_catalog, cancelled=lambda: len(seen) >= 1)
    for event in engine.decode(cancelled):
        seen.append(event)
    assert not any(isinstance(e, SummaryEvent) for e in seen)
    assert len(seen) < 3 if loop == "host" else len(seen) <= 3  # an emulated graph runs whole inside its launch
    events = engine.decode(request)
    first = next(events)
    events.close()  # the consumer goes away mid-answer
    assert isinstance(first, PointerEvent)
    again = list(engine.decode(request))
    as_tuples = lambda es: [(e.name, e.token_ids, e.score) for e in es if isinstance(e, PointerEvent)]  # noqa: E731
    assert as_tuples(again) == as_tuples(full)


@pytest.mark.parametrize("pdl", [True, False])
def test_programmatic_launches_follow_the_module_setting(fake_driver, tiny_model, tiny_catalog, pdl: bool) -> None:
    from decoder_service.engines.base import DecodeRequest, PointerEvent
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.module import Module

    engine = CudaEngine(*tiny_model, loop="host", module=Module(b"cubin", pdl=pdl), max_context=512)
    events = list(engine.decode(DecodeRequest("Read the config file", 3, tiny_catalog)))
    assert len([e for e in events if isinstance(e, PointerEvent)]) == 3
    launched = len(fake_driver.launches)
    assert launched > 0
    assert fake_driver.programmatic_launches == (launched if pdl else 0)


def test_programmatic_launch_default_follows_the_device_and_the_switch(
    fake_driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from decoder_service.engines.cuda.module import pdl_default

    assert pdl_default()  # the stand-in reports compute capability 9.0
    monkeypatch.setenv("TOOLTRIE_CUDA_PDL", "0")
    assert not pdl_default()


@pytest.mark.parametrize("loop", ["host", "graph"])
def test_cluster_attention_serves_the_requests_that_fit_it(fake_driver, tiny_model, tiny_catalog, monkeypatch, loop):
    """A request whose prompt and longest answer fit CLUSTER_ATTENTION_POSITIONS decodes with
    attention_decode_cluster, a longer one (here: a limit below the prompt) with attention_decode, and the answers
    agree (in emulation both are one numpy reference: this checks the choice and its launches)."""
    from decoder_service.engines.base import DecodeRequest
    from decoder_service.engines.cuda import engine as engine_module
    from decoder_service.engines.cuda.engine import CLUSTER_ATTENTION_ENV, CudaEngine
    from decoder_service.engines.cuda.module import Module

    monkeypatch.delenv(CLUSTER_ATTENTION_ENV, raising=False)
    answers = {}
    for limit, expected in ((10**6, "attention_decode_cluster"), (0, "attention_decode")):
        monkeypatch.setattr(engine_module, "CLUSTER_ATTENTION_POSITIONS", limit)
        engine = CudaEngine(*tiny_model, loop=loop, module=Module(b"cubin"), max_context=512)  # the default: on
        fake_driver.launches.clear()
        events = list(engine.decode(DecodeRequest("Read the config file", 2, tiny_catalog)))
        used = {
            re.sub(r"_hd\d+$", "", name.replace("_chain", ""))
            for name in fake_driver.launches
            if name.startswith("attention_decode")
        }
        # the chain forms (attention_decode_chain*) and the forms compiled for one head_dim follow the same choice
        assert used == {expected}
        assert engine.last_attention == ("cluster" if limit else "global")  # the form the benchmarks report
        answers[expected] = [e.name for e in events[:-1]]
        engine.free()
    off = CudaEngine(*tiny_model, loop=loop, module=Module(b"cubin"), max_context=512, cluster_attention=False)
    monkeypatch.setattr(engine_module, "CLUSTER_ATTENTION_POSITIONS", 10**6)
    fake_driver.launches.clear()
    assert [e.name for e in list(off.decode(DecodeRequest("Read the config file", 2, tiny_catalog)))[:-1]] == answers[
        "attention_decode"
    ]
    assert not any(name.startswith("attention") and "_cluster" in name for name in fake_driver.launches)
    off.free()
    assert answers["attention_decode_cluster"] == answers["attention_decode"]


@pytest.mark.parametrize(("variable", "attribute"), [("CLUSTER", "cluster_attention"), ("SHORT", "short_attention")])
def test_attention_form_switches_come_from_the_environment(
    fake_driver, tiny_model, monkeypatch, variable: str, attribute: str
) -> None:
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.module import Module

    name = f"TOOLTRIE_{variable}_ATTENTION"
    for value, expected in (("1", True), ("0", False), ("", True), (None, True)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
        engine = CudaEngine(*tiny_model, loop="host", module=Module(b"cubin"), max_context=512)
        assert getattr(engine, attribute) is expected
        engine.free()
    monkeypatch.setenv(name, "2")
    with pytest.raises(ValueError, match=f"{name}=2 is out of range"):
        CudaEngine(*tiny_model, loop="host", module=Module(b"cubin"), max_context=512)


@pytest.mark.parametrize("failing", range(5))
def test_an_engine_that_fails_to_build_leaves_nothing_on_the_device(
    fake_driver, tiny_model, monkeypatch, failing: int
) -> None:
    """The step state's allocations refused from the n-th on (out of device memory, after the model's weights went
    up; the fifth is the mapped output, whose polled fallback is refused too): the error reaches the caller, and the
    model and the state's earlier buffers are freed."""
    from decoder_service.engines.cuda import step
    from decoder_service.engines.cuda.driver import CudaError
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.module import Module

    allocations, step_buffer = 0, step.DeviceBuffer

    def allocate_until_failing(nbytes: int) -> step.DeviceBuffer:
        nonlocal allocations
        allocations += 1
        if allocations > failing:
            raise CudaError("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY")
        return step_buffer(nbytes)

    monkeypatch.setattr(step, "DeviceBuffer", allocate_until_failing)
    monkeypatch.setattr(step, "MappedHostBuffer", allocate_until_failing)  # the state's last buffer, mapped or polled
    before, before_host = set(fake_driver.live), set(fake_driver.live_host)
    with pytest.raises(CudaError, match="OUT_OF_MEMORY"):
        CudaEngine(*tiny_model, loop="host", module=Module(b"cubin"), max_context=512)
    assert allocations > failing
    assert fake_driver.live == before and fake_driver.live_host == before_host


def test_a_failed_launch_fails_the_request_with_what_the_driver_said(fake_driver, tiny_model, tiny_catalog) -> None:
    """A kernel launch the driver refuses (here the tenth of the request) with the context left usable: DecodeError
    with the call and the error, and the engine answers the next request."""
    from decoder_service.engines.base import DecodeRequest
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.module import Module

    engine = CudaEngine(*tiny_model, loop="host", module=Module(b"cubin"), max_context=512)
    launch, launches = fake_driver.cuLaunchKernelEx, 0

    def refuse_the_tenth(*args: object) -> tuple:
        nonlocal launches
        launches += 1
        return (719,) if launches == 10 else launch(*args)

    fake_driver.cuLaunchKernelEx = refuse_the_tenth  # type: ignore[method-assign]
    request = DecodeRequest("Read the config file", 2, tiny_catalog)
    with pytest.raises(DecodeError, match=r"the GPU failed: cuLaunchKernelEx\(\w+\) failed: EMULATED_ERROR_719"):
        list(engine.decode(request))
    assert launches == 10 and engine.failure is None
    assert len(list(engine.decode(request))) == 3  # two pointers and the summary
    engine.free()


def test_a_sticky_gpu_error_ends_the_engine(fake_driver, tiny_model, tiny_catalog, monkeypatch) -> None:
    """A launch that leaves the context failed (an illegal address: every later call fails too): EngineFailed, the
    engine records why, and every later request is refused with it before any driver call."""
    from decoder_service.engines.base import DecodeRequest, EngineFailed
    from decoder_service.engines.cuda import driver
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.module import Module
    from tests.decoder_service.engines.cuda.emulator import StickyFailure

    engine = CudaEngine(*tiny_model, loop="host", module=Module(b"cubin"), max_context=512)
    launch, launches = fake_driver.cuLaunchKernelEx, 0

    def fail_the_context_at_the_tenth(*args: object) -> tuple:
        nonlocal launches
        launches += 1
        if launches < 10:
            return launch(*args)
        monkeypatch.setattr(driver, "cu", StickyFailure(fake_driver, 700))
        return (700,)

    fake_driver.cuLaunchKernelEx = fail_the_context_at_the_tenth  # type: ignore[method-assign]
    request = DecodeRequest("Read the config file", 2, tiny_catalog)
    message = r"the GPU context failed, this engine serves no more requests: .*EMULATED_ERROR_700"
    with pytest.raises(EngineFailed, match=message):
        list(engine.decode(request))
    assert engine.failure is not None and launches == 10
    with pytest.raises(EngineFailed, match=message):
        list(engine.decode(request))
    assert launches == 10


@pytest.mark.parametrize("room", [1, 0])
def test_prefix_kv_copies_that_do_not_fit_make_room_or_are_skipped(
    fake_driver, tiny_model, tiny_catalog, monkeypatch, caplog, room: int
) -> None:
    """A device with room for ``room`` saved prefix KVs beside the engine. Saving a prefix drops the least recently
    used one until it fits; with room for none it is not saved (a warning says so) and the request is answered all
    the same, its prefix still reused while it stays in the model's cache. Every answer is an unlimited engine's."""
    from decoder_service.engines.base import SummaryEvent
    from decoder_service.engines.cuda import engine as engine_module
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.memory import DeviceMemoryError
    from decoder_service.engines.cuda.module import Module
    from decoder_service.engines.prompt import request_suffix_ids

    config = tiny_model[0]
    trie, suffix = tiny_catalog.trie, request_suffix_ids(tiny_catalog, "Read the config file", 2)
    prefixes = {"a": list(tiny_catalog.prefix_ids), "b": list(reversed(tiny_catalog.prefix_ids))}

    def answer(engine: CudaEngine, key: str) -> tuple[list[tuple[str, float]], bool]:
        events = list(engine.decode_ids(trie, 2, prefixes[key], suffix, cache_key=key))
        assert isinstance(events[-1], SummaryEvent)
        return [(e.name, e.score) for e in events[:-1]], events[-1].prefix_cached

    def engine() -> CudaEngine:
        return CudaEngine(*tiny_model, loop="host", module=Module(b"cubin"), max_context=512)

    unlimited = engine()
    expected = {key: answer(unlimited, key)[0] for key in prefixes}
    unlimited.free()

    real, made = engine_module.DeviceBuffer, []
    copy_bytes = 2 * config.num_layers * len(prefixes["a"]) * config.num_kv_heads * config.head_dim * 2

    def allocate_within_room(nbytes: int):
        if sum(buf.nbytes for buf in made if buf.ptr) + nbytes > room * copy_bytes:
            raise DeviceMemoryError(f"cuMemAlloc of {nbytes} bytes failed: out of device memory")
        made.append(real(nbytes))
        return made[-1]

    monkeypatch.setattr(engine_module, "DeviceBuffer", allocate_within_room)
    limited = engine()
    runs = [(key, *answer(limited, key)) for key in ("a", "b", "a", "a")]
    assert [(key, names) for key, names, _ in runs] == [(key, expected[key]) for key in ("a", "b", "a", "a")]
    assert [cached for _, _, cached in runs] == [False, False, False, True]
    assert list(limited._prefixes) == (["a"] if room else [])
    assert ("is not kept for reuse" in caplog.text) == (room == 0)
    limited.free()
    assert not any(buf.ptr for buf in made)


@pytest.mark.parametrize("loop", ["host", "graph"])
def test_short_attention_serves_the_requests_that_fit_it(fake_driver, tiny_catalog, monkeypatch, loop) -> None:
    """With head_dim 64 (a compiled one) and the cluster form off, a request within SHORT_ATTENTION_POSITIONS takes
    attention_decode_short (a chain would keep attention_decode_chain), a longer one (here: a limit below the
    prompt) attention_decode, and the answers agree (one numpy reference in emulation: this checks
    the choice, its launches, and the emulator's check that no short launch runs past its contexts)."""
    from decoder_service.engines.base import DecodeRequest
    from decoder_service.engines.cuda import forward
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.module import Module
    from decoder_service.models.synth import PRESETS, synthetic_weights

    cfg = dataclasses.replace(PRESETS["tiny"], head_dim=64)
    weights = dict(synthetic_weights(cfg, 7))
    answers, passes = {}, {"forced_tail": False, "forced_chains": False}  # a forward pass a token
    for limit, form in ((forward.SHORT_ATTENTION_POSITIONS, "short"), (0, "global")):
        monkeypatch.setattr(forward, "SHORT_ATTENTION_POSITIONS", limit)
        engine = CudaEngine(
            cfg, weights, loop=loop, module=Module(b"cubin"), max_context=512, cluster_attention=False, **passes
        )
        fake_driver.launches.clear()
        events = list(engine.decode(DecodeRequest("Read the config file", 2, tiny_catalog)))
        used = {name for name in fake_driver.launches if name.startswith("attention_decode")}
        single = "attention_decode_short_hd64" if form == "short" else "attention_decode_hd64"
        assert used == {single}
        assert {key[2] for key in engine._drivers} == {form}
        assert engine.last_attention == form
        answers[form] = [e.name for e in events[:-1]]
        engine.free()
    assert answers["short"] == answers["global"]


def test_short_attention_needs_a_compiled_head_dim() -> None:
    from decoder_service.engines.cuda.forward import decode_attention_kernel, short_attention_fits

    assert decode_attention_kernel(128, "short") == "attention_decode_short_hd128"
    assert decode_attention_kernel(64, "short", chain=True) == "attention_decode_chain_hd64"
    assert short_attention_fits(128, 1024) and not short_attention_fits(128, 1025)
    assert not short_attention_fits(16, 100)
    with pytest.raises(ValueError, match="no short decode attention for head_dim 16"):
        decode_attention_kernel(16, "short")


@pytest.mark.parametrize("loop", ["host", "graph"])
def test_forced_chains_give_the_answer_of_a_pass_per_token(fake_driver, tiny_model, tiny_catalog, loop) -> None:
    """The tokens the grammar forces after a chosen one go through one forward pass (the kernels' chain forms, the
    graph's IF node): the pointers, tokens and scores of a pass per token, in fewer passes."""
    from decoder_service.engines.base import DecodeRequest
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.module import Module

    answers, passes = {}, {}
    for chains in (True, False):
        engine = CudaEngine(
            *tiny_model, loop=loop, module=Module(b"cubin"), max_context=512, forced_chains=chains, forced_tail=False
        )
        assert engine.chain_tokens == (4 if chains else 1)
        fake_driver.launches.clear()
        events = list(engine.decode(DecodeRequest("Tell the team the deploy is done", 3, tiny_catalog)))
        answers[chains] = [(e.name, e.token_ids, e.score) for e in events[:-1]]
        passes[chains] = events[-1].forward_passes
        assert ("gemv_stream_chain16_bf16" in fake_driver.launches) is chains  # 16-warp blocks: hidden <= 4,096
        engine.free()
    assert answers[True] == answers[False]
    assert passes[True] < passes[False]


def test_forced_chains_need_the_layered_streaming_step(fake_driver, tiny_model, monkeypatch) -> None:
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.module import Module
    from decoder_service.engines.env import FORCED_CHAINS_ENV

    monkeypatch.delenv(FORCED_CHAINS_ENV, raising=False)
    layered = CudaEngine(*tiny_model, loop="host", module=Module(b"cubin"), max_context=512)
    persistent = CudaEngine(
        *tiny_model, loop="host", module=Module(b"cubin"), max_context=512, decode_kernel="persistent"
    )
    assert layered.chains and not persistent.chains and persistent.chain_tokens == 1
    with pytest.raises(ValueError, match="takes no forced chains"):
        persistent.model.chain_launches(0, 0, 0, attention="global")
    monkeypatch.setenv(FORCED_CHAINS_ENV, "0")
    assert not CudaEngine(*tiny_model, loop="host", module=Module(b"cubin"), max_context=512).chains
    for engine in (layered, persistent):
        engine.free()


def test_prefill_attention_groups_queries_where_a_form_is_compiled(fake_driver, tiny_catalog, monkeypatch) -> None:
    """Prefill attention takes attention_prefill_hd64 for head_dim 64 (each block a kv head's queries of up to
    ATTN_PREFILL_QUERIES / group tokens, the emulator checks the grid) and `attention` with
    TOOLTRIE_PREFILL_ATTENTION=0 or for head_dim 16 (the tiny preset's); the answers agree (in emulation both are
    one numpy reference: the GPU test holds the grouped kernel within 1e-4 of float64)."""
    from decoder_service.engines.base import DecodeRequest
    from decoder_service.engines.cuda.engine import CudaEngine
    from decoder_service.engines.cuda.forward import PREFILL_ATTENTION_ENV
    from decoder_service.engines.cuda.module import Module
    from decoder_service.models.synth import PRESETS, synthetic_weights

    answers = {}
    for head_dim, grouped, expected in ((64, "1", "attention_prefill_hd64"), (64, "0", "attention"), (16, "1", None)):
        monkeypatch.setenv(PREFILL_ATTENTION_ENV, grouped)
        cfg = dataclasses.replace(PRESETS["tiny"], head_dim=head_dim)
        engine = CudaEngine(cfg, dict(synthetic_weights(cfg, 7)), loop="host", module=Module(b"cubin"), max_context=512)
        fake_driver.launches.clear()
        events = list(engine.decode(DecodeRequest("Read the config file", 2, tiny_catalog)))
        used = {name for name in fake_driver.launches if name == "attention" or name.startswith("attention_prefill")}
        assert used == {expected or "attention"}
        answers[(head_dim, grouped)] = [e.name for e in events[:-1]]
        engine.free()
    assert answers[(64, "1")] == answers[(64, "0")]
