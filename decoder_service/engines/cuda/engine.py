"""The CUDA engine: constrained greedy decoding with the grammar step on the device.

Per request: the catalog prefix's KV (computed once per ``PreparedCatalog.cache_key``), a prefill of the request
suffix, then one launch of the device-resident loop (``graph_loop``) or, with ``loop='host'``, the host-driven
loop over the same kernels. Completed pointers are read from mapped host memory while the loop runs, so each is
yielded as soon as its SEP/STOP is chosen; its score sums the step log's fp32 log-probs in float64.

One engine decodes one request at a time (one stream, one control block): callers serialise requests, as the
decoder service's admission does with one active slot per engine.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path

import numpy as np

from decoder_service.engines.base import (
    CHAIN_TOKENS,
    HEADS,
    DecodeError,
    DecodeRequest,
    Engine,
    EngineFailed,
    EngineOutOfMemory,
    Event,
    PointerEvent,
    SummaryEvent,
    check_context,
    longest_answer,
)
from decoder_service.engines.cuda import driver
from decoder_service.engines.cuda.driver import CudaError, call
from decoder_service.engines.cuda.forward import (
    CLUSTER_ATTENTION_POSITIONS,
    KV_ENTRY_BYTES,
    AttentionForm,
    CudaModel,
    short_attention_fits,
)
from decoder_service.engines.cuda.graph_loop import DecodeGraph
from decoder_service.engines.cuda.host_grammar_loop import HostLoop
from decoder_service.engines.cuda.memory import DeviceBuffer, DeviceMemoryError
from decoder_service.engines.cuda.module import Module
from decoder_service.engines.cuda.step import CTL, ERRORS, HEAD_SLOTS, K_MAX, MAX_NAME_TOKENS, ControlInit, StepState
from decoder_service.engines.cuda.trie_upload import DeviceTrie, Placement
from decoder_service.engines.env import env_int, forced_chains_default, forced_tail_default
from decoder_service.models.config import ModelConfig
from tooltrie.grammar.runtime import GrammarState
from tooltrie.grammar.trie import CompiledTrie

log = logging.getLogger(__name__)

LOOPS = ("graph", "host")
CUBIN_ENV = "TOOLTRIE_CUBIN"
DEFAULT_CUBIN = Path(__file__).resolve().parents[3] / "cuda" / "build" / "tooltrie.cubin"
POLL_SECONDS = 20e-6


def cubin_path() -> Path | None:
    """The cubin the engine loads: $TOOLTRIE_CUBIN, else cuda/build/tooltrie.cubin; None when neither exists."""
    env = os.environ.get(CUBIN_ENV)
    path = Path(env) if env else DEFAULT_CUBIN
    return path if path.is_file() else None


def load_module(pdl: bool | None = None) -> Module:
    """The cubin as a module; ``pdl`` as in ``Module`` (None: where the device has it)."""
    path = cubin_path()
    if path is None:
        raise FileNotFoundError(
            f"no cubin at ${CUBIN_ENV} or {DEFAULT_CUBIN}; build it with `tooltrie cuda build` (needs nvcc)"
        )
    return Module(path, pdl=pdl)


CLUSTER_ATTENTION_ENV = "TOOLTRIE_CLUSTER_ATTENTION"  # 0: attention_decode for every request
SHORT_ATTENTION_ENV = "TOOLTRIE_SHORT_ATTENTION"  # 0: attention_decode where the cluster form does not apply


class _Cancelled(Exception):
    """The request's ``cancelled`` callback turned True."""


class CudaEngine(Engine):
    """Serial (batch 1) decoding on one GPU. ``head``: 'sparse' (legal rows only; nodes wider than 256 legal
    tokens fall back to the dense head) or 'dense'. ``loop``: 'graph' (device-resident) or 'host'.
    ``decode_kernel``: the forward step's form, as ``CudaModel`` takes it ('layers' or 'persistent'; default
    $TOOLTRIE_DECODE_KERNEL, else 'layers'). ``cluster_attention``: run a request's decode attention as
    attention_decode_cluster when its prompt and longest answer stay within CLUSTER_ATTENTION_POSITIONS (the same
    bits, gate 10; on an H200 35 µs per token faster there and slower past it, docs/cuda-speed-notes.md #65-#66).
    Default $TOOLTRIE_CLUSTER_ATTENTION, else on. ``short_attention``: otherwise, within SHORT_ATTENTION_POSITIONS
    and for a compiled head_dim, as attention_decode_short (the same bits, gate 14; on an H100 7 µs per token faster
    at 300 and 708 positions, #133). Default $TOOLTRIE_SHORT_ATTENTION, else on. ``forced_tail``: once the grammar
    leaves one legal token at every remaining step, the step kernel takes them all and the loop ends without their
    forward passes (the same tokens and scores, gate 11). Default $TOOLTRIE_FORCED_TAIL, else on. ``forced_chains``: the
    tokens the grammar forces after a chosen one (up to CHAIN_TOKENS in all) go through the model in one forward pass,
    whose every token has the bits of a pass of its own (gate 12); where the model's step takes no chains
    (``supports_chains``), one pass per token. Default $TOOLTRIE_FORCED_CHAINS, else on. ``weight_format``: 'bf16', or
    'fp8' for weights quantized by ``decoder_service.models.fp8.quantize_weights`` (CudaModel's single-token GEMVs then
    read e4m3 bytes: the same bits, half the weight bytes)."""

    name = "cuda"

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, np.ndarray],
        head: str = "sparse",
        *,
        loop: str = "graph",
        module: Module | None = None,
        max_context: int = 2048,
        max_prefill: int = 512,
        trie_placement: Placement = "auto",
        prefix_cache_entries: int = 4,
        decode_kernel: str | None = None,
        cluster_attention: bool | None = None,
        short_attention: bool | None = None,
        forced_tail: bool | None = None,
        forced_chains: bool | None = None,
        weight_format: str = "bf16",
    ) -> None:
        if head not in HEADS:
            raise ValueError(f"unknown head {head!r}; accepted: {', '.join(HEADS)}")
        if loop not in LOOPS:
            raise ValueError(f"unknown loop {loop!r}; accepted: {', '.join(LOOPS)}")
        self.head, self.loop, self.trie_placement = head, loop, trie_placement
        if cluster_attention is None:
            cluster_attention = env_int(CLUSTER_ATTENTION_ENV, 1, 0, 1) == 1
        self.cluster_attention = cluster_attention
        if short_attention is None:
            short_attention = env_int(SHORT_ATTENTION_ENV, 1, 0, 1) == 1
        self.short_attention = short_attention
        self.forced_tail = forced_tail_default() if forced_tail is None else forced_tail
        self.forced_chains = forced_chains_default() if forced_chains is None else forced_chains
        self.module = module or load_module()  # one module per engine: its constant bank is this engine's
        self.model = CudaModel(
            config,
            weights,
            self.module,
            max_context=max_context,
            max_prefill=max_prefill,
            decode_kernel=decode_kernel,
            weight_format=weight_format,
        )
        self.stream = self.model.stream
        self.context = self.model.max_context  # the KV cache's positions
        try:
            self.state = StepState(config.vocab_size, K_MAX * (MAX_NAME_TOKENS + 1), self.stream)
        except BaseException:
            self.model.free()  # an engine that fails to build leaves nothing on the device
            raise
        # (loop, dense, attention form, chains)
        self._drivers: dict[tuple[str, bool, AttentionForm, bool], HostLoop | DecodeGraph] = {}
        self._tries: OrderedDict[int, DeviceTrie] = OrderedDict()
        self._prefixes: OrderedDict[str, list[DeviceBuffer]] = OrderedDict()
        self._prefix_entries = prefix_cache_entries
        self._resident: str | None = None  # the prefix whose KV sits in the model's cache now
        self._allowed: DeviceBuffer | None = None
        self._lock = threading.Lock()
        self.last_steps = 0
        self.last_streamed = 0  # pointers of the last answer yielded while the device loop still ran
        self.last_attention: AttentionForm | None = None  # the decode attention the last answer took

    # -- the engine interface -----------------------------------------------------------------------------
    def decode(self, request: DecodeRequest) -> Iterator[Event]:
        from decoder_service.engines.prompt import request_suffix_ids

        catalog = request.catalog
        GrammarState(catalog.trie, request.k, allowed=request.allowed)  # the host runtime's checks and messages
        suffix = request_suffix_ids(catalog, request.intent, request.k)
        yield from self.decode_ids(
            catalog.trie,
            request.k,
            catalog.prefix_ids,
            suffix,
            cache_key=catalog.cache_key,
            allowed=request.allowed,
            catalog_version=catalog.version,
            cancelled=request.cancelled,
        )

    # -- token-level entry point (tests, benchmarks) ------------------------------------------------------
    def decode_ids(
        self,
        trie: CompiledTrie,
        k: int,
        prefix_ids: Sequence[int],
        suffix_ids: Sequence[int],
        *,
        cache_key: str | None = None,
        allowed: Sequence[int] | None = None,
        catalog_version: int = 0,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> Iterator[Event]:
        """Decode k pointers after ``prefix_ids + suffix_ids``; the prefix KV is reused under ``cache_key``.

        ``cancelled`` is polled while the loop runs: once True, no further event is yielded (no summary either).
        A device loop already launched runs its answer out (k names) before the engine takes the next request.
        """
        if self.failure is not None:
            raise EngineFailed(self.failure)
        max_steps = self._check(trie, k, len(prefix_ids), len(suffix_ids))
        with self._lock:  # one request at a time: the stream, the KV cache and the control block are shared
            try:
                yield from self._decode_locked(
                    trie, k, prefix_ids, suffix_ids, max_steps, cache_key, allowed, catalog_version, cancelled
                )
            except DeviceMemoryError as exc:  # e.g. a new catalog's trie that no longer fits beside the rest
                raise EngineOutOfMemory(str(exc)) from exc
            except (CudaError, DecodeError) as exc:
                if not driver.context_usable():  # a sticky error: no later request can run either
                    self.failure = f"the GPU context failed, this engine serves no more requests: {exc}"
                    log.error("%s", self.failure)
                    raise EngineFailed(self.failure) from exc
                if isinstance(exc, DecodeError):
                    raise
                raise DecodeError(f"the GPU failed: {exc}") from exc  # a failed launch or copy, the context intact

    def _decode_locked(
        self,
        trie: CompiledTrie,
        k: int,
        prefix_ids: Sequence[int],
        suffix_ids: Sequence[int],
        max_steps: int,
        cache_key: str | None,
        allowed: Sequence[int] | None,
        catalog_version: int,
        cancelled: Callable[[], bool],
    ) -> Iterator[Event]:
        driver.init()  # the context must be current in the calling thread (servers decode on worker threads)
        t0 = time.perf_counter()
        cached = self._load_prefix(cache_key, prefix_ids)
        self.model.prefill(list(suffix_ids))
        prompt_tokens = self.model.length
        dense = self._start(trie, k, max_steps, prompt_tokens, allowed)
        form = self.last_attention = self._attention_form(prompt_tokens + max_steps)
        prefill_seconds = time.perf_counter() - t0

        decode_start = time.perf_counter()
        emitted = yield from self._pointer_events(trie, dense, form, cancelled)
        if emitted is None:
            return  # the caller is gone
        ctl = self.state.read_ctl()
        self.last_steps = int(ctl[CTL["steps"]])
        forced = int(ctl[CTL["forced"]])
        self.model.length = prompt_tokens  # the answer's KV is not kept: the next request starts after the prompt
        error = int(ctl[CTL["error"]])
        if error:
            raise DecodeError(
                f"decoding stopped after {self.last_steps} tokens: {ERRORS.get(error, f'device error {error}')} "
                f"(trie node {int(ctl[CTL['errnode']])})"
            )
        if not ctl[CTL["done"]] or emitted != k:
            raise DecodeError(f"the device loop ended without finishing the answer ({emitted} of {k} pointers)")
        yield SummaryEvent(
            tokens_generated=self.last_steps,
            forward_passes=self.last_steps - 1 - forced,  # the first token comes from the prefill's logits
            prompt_tokens=prompt_tokens,
            prefix_cached=cached,
            prefill_seconds=prefill_seconds,
            decode_seconds=time.perf_counter() - decode_start,
            catalog_version=catalog_version,
        )

    def _check(self, trie: CompiledTrie, k: int, n_prefix: int, n_suffix: int) -> int:
        """Refuse what the device loop cannot finish; return the step limit k * (longest name + 1)."""
        if not 1 <= k <= K_MAX:
            raise ValueError(f"k={k} is out of range; accepted: 1 to {K_MAX}")
        if not n_suffix:
            raise ValueError("the request suffix is empty; at least one token must follow the cached prefix")
        longest = trie.longest_path
        if longest > MAX_NAME_TOKENS:
            raise ValueError(f"the trie has names of {longest} tokens; the device publishes at most {MAX_NAME_TOKENS}")
        max_steps = longest_answer(longest, k)
        check_context(n_prefix, n_suffix, max_steps, self.context)
        return max_steps

    def _start(
        self, trie: CompiledTrie, k: int, max_steps: int, prompt_tokens: int, allowed: Sequence[int] | None
    ) -> bool:
        """Upload the request's grammar state and bind its trie, stream-ordered; return whether the head is dense."""
        dt = self._device_trie(trie)
        allowed_ptr, n_allowed = self._upload_allowed(allowed)
        init = ControlInit(
            position=prompt_tokens - 1,
            k=k,
            max_steps=max_steps,
            trie_ptr=dt.global_ptr,
            allowed_ptr=allowed_ptr,
            n_allowed=n_allowed,
            forced_tail=self.forced_tail,
            chains=self.chains,
        )
        self.state.reset(init)
        dt.bind(self.module, self.stream)  # after the previous answer, before this one
        self.stream.synchronize()
        return self.head == "dense" or trie.stats.max_out_degree > HEAD_SLOTS

    def _pointer_events(
        self, trie: CompiledTrie, dense: bool, form: AttentionForm, cancelled: Callable[[], bool]
    ) -> Generator[PointerEvent, None, int | None]:
        """Run the loop, yielding each pointer the device publishes, while it runs and after.

        Returns the number of pointers, or None when ``cancelled`` turned True.
        """
        emitted, last = 0, time.perf_counter()

        def drain() -> Iterator[PointerEvent]:
            nonlocal emitted, last
            for pub in self.state.published(emitted):
                if cancelled():
                    raise _Cancelled
                score = self.state.score(pub)  # a failed read is decode_ids's to report
                now = time.perf_counter()
                yield PointerEvent(
                    index=emitted,
                    pointer_id=pub.pointer,
                    name=trie.names[pub.pointer],
                    token_ids=pub.tokens,
                    score=score,
                    seconds=now - last,
                    steps=len(pub.tokens) + 1,
                )
                emitted, last = emitted + 1, now

        loop = self._run(dense, form)
        try:
            for _ in loop:
                if cancelled():
                    raise _Cancelled
                yield from drain()
            self.last_streamed = emitted
            yield from drain()  # anything completed after the last poll
            return None if cancelled() else emitted
        except _Cancelled:
            return None
        finally:  # also when the consumer closes the stream early
            loop.close()
            self.stream.synchronize()  # a graph still running must not race the next request's reset

    def read_trace(self) -> np.ndarray:
        """(token, logit bits, log-prob bits) of every step of the last answer."""
        return self.state.read_trace(self.last_steps)

    # -- internals ----------------------------------------------------------------------------------------
    @property
    def chains(self) -> bool:
        """Whether this engine's answers take forced chains: asked for and supported by the model's step."""
        return self.forced_chains and self.model.supports_chains

    @property
    def chain_tokens(self) -> int:
        """The most tokens one forward pass takes."""
        return CHAIN_TOKENS if self.chains else 1

    def _attention_form(self, positions: int) -> AttentionForm:
        """The decode attention of an answer whose every step stays within ``positions`` (the persistent kernel
        has its own): the cluster form within its contexts, else the short form within its own, else the global."""
        if self.model.persistent is not None:
            return "global"
        if self.cluster_attention and positions <= CLUSTER_ATTENTION_POSITIONS:
            return "cluster"
        if self.short_attention and short_attention_fits(self.model.config.head_dim, positions):
            return "short"
        return "global"

    def _run(self, dense: bool, form: AttentionForm) -> Iterator[None]:
        chains = self.chains
        key = (self.loop, dense, form, chains)
        drv = self._drivers.get(key)
        if drv is None:
            drv = (
                HostLoop(self.model, self.state, dense, form, chains)
                if self.loop == "host"
                else DecodeGraph(self.model, self.state, dense, form, chains)
            )
            self._drivers[key] = drv
        if isinstance(drv, HostLoop):
            yield from drv.run()
            return
        drv.launch()
        cu = driver.cu
        while True:
            err = cu.cuStreamQuery(self.stream.handle)[0]
            if err == cu.CUresult.CUDA_SUCCESS:
                return
            if err != cu.CUresult.CUDA_ERROR_NOT_READY:
                driver.check((err,), "cuStreamQuery")
            yield
            time.sleep(POLL_SECONDS)

    def _device_trie(self, trie: CompiledTrie) -> DeviceTrie:
        dt = self._tries.get(id(trie))
        if dt is None or dt.trie is not trie:
            dt = DeviceTrie(trie, self.stream, self.trie_placement)
            self._tries[id(trie)] = dt
            while len(self._tries) > 8:
                self._tries.popitem(last=False)[1].free()
        self._tries.move_to_end(id(trie))
        return dt

    def _upload_allowed(self, allowed: Sequence[int] | None) -> tuple[int, int]:
        if allowed is None:
            return 0, -1
        ids = np.unique(np.asarray(list(allowed), dtype=np.int32))
        need = max(1, ids.size) * 4
        if self._allowed is None or self._allowed.nbytes < need:
            if self._allowed is not None:
                self.stream.synchronize()
                self._allowed.free()
            self._allowed = DeviceBuffer(max(need, 4096))
        if ids.size:
            self._allowed.upload(ids, self.stream)
        return self._allowed.ptr, int(ids.size)

    def _load_prefix(self, key: str | None, prefix_ids: Sequence[int]) -> bool:
        """Put the prefix's KV in the model's cache; True when it was reused rather than computed."""
        m, n = self.model, len(prefix_ids)
        if n and key is not None and key == self._resident:
            m.length = n  # positions below n are untouched since the prefix was computed
            return True
        saved = self._prefixes.get(key) if key is not None else None
        if saved is not None and n:
            nbytes = n * m.kv_width * KV_ENTRY_BYTES
            for buf, dst in zip(saved, [*m.k_cache, *m.v_cache], strict=True):
                call("cuMemcpyDtoDAsync", dst.ptr, buf.ptr, nbytes, self.stream.handle)
            self._prefixes.move_to_end(key)
            m.length, self._resident = n, key
            return True
        m.reset()
        self._resident = None
        if not n:
            return False
        m.prefill(list(prefix_ids))
        if key is not None:
            copies = self._copy_prefix_kv(n)
            if copies is not None:
                self._prefixes[key] = copies
                while len(self._prefixes) > self._prefix_entries:
                    self._drop_oldest_prefix()
            self._resident = key
        return False

    def _copy_prefix_kv(self, n: int) -> list[DeviceBuffer] | None:
        """Copies of the model's first ``n`` cached positions, one buffer a layer's K and one its V. Where the device
        has no room for them, the least recently used saved prefixes go until it has; with none left, None: the
        request goes on with its prefix computed, only not saved for the next."""
        m = self.model
        nbytes = n * m.kv_width * KV_ENTRY_BYTES
        while True:
            copies: list[DeviceBuffer] = []
            try:
                for _ in range(2 * len(m.k_cache)):
                    copies.append(DeviceBuffer(nbytes))
            except DeviceMemoryError as exc:
                for buf in copies:
                    buf.free()
                if not self._prefixes:
                    log.warning("the prefix KV of %d positions is not kept for reuse: %s", n, exc)
                    return None
                self._drop_oldest_prefix()
                continue
            for buf, src in zip(copies, [*m.k_cache, *m.v_cache], strict=True):
                call("cuMemcpyDtoDAsync", buf.ptr, src.ptr, nbytes, self.stream.handle)
            return copies

    def _drop_oldest_prefix(self) -> None:
        self.stream.synchronize()  # no copy from or to its buffers is still queued
        for buf in self._prefixes.popitem(last=False)[1]:
            buf.free()

    def free(self) -> None:
        self.stream.synchronize()
        for drv in self._drivers.values():
            if isinstance(drv, DecodeGraph):
                drv.destroy()
        for dt in self._tries.values():
            dt.free()
        for bufs in self._prefixes.values():
            for buf in bufs:
                buf.free()
        if self._allowed is not None:
            self._allowed.free()
        self.state.free()
        self.model.free()
