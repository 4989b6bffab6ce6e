"""The grammar step on the device (cuda/trie_step.cuh): the sequence's control block, the published output,
and the launches of one step (head, then step, which also masks the next node; the answer's first step begins
with a mask of its own) that both decode loops issue.

Layouts mirror the ``TT_*`` macros of cuda/trie_step.cuh; a test parses the header and checks them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from decoder_service.engines.cuda.driver import CudaError, Stream, call
from decoder_service.engines.cuda.forward import F32, GEMV_WARPS, AttentionForm, CudaModel, gemv_warps_per_row
from decoder_service.engines.cuda.memory import DeviceBuffer, MappedHostBuffer
from decoder_service.engines.cuda.module import Launch

TRIE_THREADS = 256
HEAD_SLOTS = 256  # TRIE_HEAD_SLOTS: candidates the sparse head can serve
K_MAX = 16
MAX_NAME_TOKENS = 132
OUT_HEADER = 8
REC_WORDS = 4 + MAX_NAME_TOKENS
OUT_WORDS = OUT_HEADER + K_MAX * REC_WORDS
CTL_WORDS = 64
CTL = {
    "token": 0,
    "pos": 1,
    "node": 2,
    "owed": 3,
    "nspent": 4,
    "done": 5,
    "error": 6,
    "steps": 7,
    "nallowed": 8,
    "ncand": 9,
    "curlen": 10,
    "curscore": 11,
    "errnode": 12,
    "maxsteps": 13,
    "trie": 14,
    "allowed": 16,
    "flags": 18,
    "forced": 19,
    "nchain": 20,
    "chain_pos": 21,
    "chain": 24,
    "spent": 32,
}
FLAG_FORCED_TAIL = 1  # TT_FLAG_FORCED_TAIL: the step takes the forced rest of the answer without forward passes
FLAG_CHAINS = 2  # TT_FLAG_CHAINS: forced tokens after the chosen one join it in the next forward pass
NO_LOGIT = 0x7FC00000  # TT_NO_LOGIT: the step log's logit for tokens taken without their own logits
OUT_COUNT, OUT_FINISHED, OUT_ERROR, OUT_STEPS = 0, 1, 2, 3
# Record words: pointer id, token count, the device's fp32 running score (diagnostic: the host sums the step
# log's fp32 terms in float64, as the contract says), step of the closing token, then the tokens.
ERRORS = {
    1: "the grammar left no legal token (empty mask)",
    2: "the chosen token is not a live edge of the current trie node",
    3: "the model produced a non-finite logit for a legal token",
    4: "a name ran past the longest name the decoder can publish",
    5: "the answer did not end within the step limit k * (depth + 1)",
    6: "a trie node has more legal tokens than the sparse head's slots; use the dense head",
}


@dataclass(slots=True)
class ControlInit:
    """What a request sets before its first step."""

    position: int  # position of the last prompt token (the first chosen token goes at position + 1)
    k: int
    max_steps: int
    trie_ptr: int  # 0: the constant bank
    allowed_ptr: int = 0
    n_allowed: int = -1  # -1: the whole catalog
    forced_tail: bool = True
    chains: bool = False

    def words(self) -> np.ndarray:
        w = np.zeros(CTL_WORDS, dtype=np.int32)
        w[CTL["pos"]] = self.position
        w[CTL["flags"]] = (FLAG_FORCED_TAIL if self.forced_tail else 0) | (FLAG_CHAINS if self.chains else 0)
        w[CTL["nchain"]] = 1
        w[CTL["owed"]] = self.k
        w[CTL["nallowed"]] = self.n_allowed
        w[CTL["maxsteps"]] = self.max_steps
        w[CTL["spent"] : CTL["spent"] + K_MAX] = -1
        raw = w.view(np.uint8)
        raw[4 * CTL["trie"] : 4 * CTL["trie"] + 8] = np.frombuffer(struct.pack("<Q", self.trie_ptr), np.uint8)
        raw[4 * CTL["allowed"] : 4 * CTL["allowed"] + 8] = np.frombuffer(struct.pack("<Q", self.allowed_ptr), np.uint8)
        return w


@dataclass(frozen=True, slots=True)
class Published:
    """One completed pointer as the step kernel published it."""

    pointer: int
    tokens: tuple[int, ...]
    step: int  # index of its closing SEP/STOP among the generated tokens


class PolledDeviceBuffer:
    """Fallback for ``MappedHostBuffer``: device memory read back with a synchronous copy on the legacy stream,
    which does not wait for the engine's non-blocking stream, so polling still sees pointers as they complete."""

    def __init__(self, nbytes: int) -> None:
        self.device = DeviceBuffer(nbytes)
        self.ptr = self.device.ptr
        self._host = np.zeros(nbytes // 4, dtype=np.int32)
        self._header_dirty = False

    @property
    def words(self) -> np.ndarray:
        if self._header_dirty:  # a host write to the header goes to the device first
            call("cuMemcpyHtoD", self.ptr, self._host.ctypes.data, OUT_HEADER * 4)
            self._header_dirty = False
        call("cuMemcpyDtoH", self._host.ctypes.data, self.ptr, self._host.nbytes)
        return self._host

    def clear_header(self) -> None:
        self._host[:OUT_HEADER] = 0
        self._header_dirty = True
        _ = self.words

    def free(self) -> None:
        self.device.free()


class StepState:
    """Device buffers of one sequence's grammar step, and the mapped output the host polls."""

    def __init__(self, vocab_size: int, max_steps: int, stream: Stream) -> None:
        self.stream = stream
        self.cand_cap = vocab_size  # a node cannot have more distinct tokens than the vocabulary
        self.max_trace = max_steps
        self._init = np.zeros(CTL_WORDS, dtype=np.int32)
        try:
            self._allocate()
        except BaseException:
            self.free()  # a failed allocation leaves nothing on the device
            raise

    def _allocate(self) -> None:
        self.ctl = DeviceBuffer(CTL_WORDS * 4)
        self.cand = DeviceBuffer(2 * self.cand_cap * 4)
        self.cand_logit = DeviceBuffer(HEAD_SLOTS * F32)
        self.trace = DeviceBuffer(3 * self.max_trace * 4)
        self.out: MappedHostBuffer | PolledDeviceBuffer
        try:
            self.out = MappedHostBuffer(OUT_WORDS * 4)
        except CudaError:  # no mapped pinned memory here: poll a device buffer from the legacy stream instead
            self.out = PolledDeviceBuffer(OUT_WORDS * 4)

    def reset(self, init: ControlInit) -> None:
        """Stream-ordered: the next step on ``stream`` starts a new answer."""
        self._init[:] = init.words()
        call("cuMemcpyHtoDAsync", self.ctl.ptr, self._init.ctypes.data, self._init.nbytes, self.stream.handle)
        if isinstance(self.out, PolledDeviceBuffer):
            self.out.clear_header()
        else:
            self.out.words[:OUT_HEADER] = 0

    def read_ctl(self) -> np.ndarray:
        return self.ctl.download(np.int32, CTL_WORDS, self.stream)

    def read_trace(self, steps: int) -> np.ndarray:
        """(token, logit bits, log-prob bits) of each of the first ``steps`` tokens (after the stream is idle); the
        rows of a forced tail and of a chain's tokens past its first carry NO_LOGIT."""
        return self.trace.download(np.int32, (steps, 3), self.stream)

    def score(self, pub: Published) -> float:
        """The contract's score of a published pointer: its tokens' fp32 log-probs summed in float64, in order.

        Read from the step log with a synchronous copy on the legacy stream, which does not wait for the
        engine's non-blocking stream: the rows read were written by kernels that finished before the step that
        published the pointer. The log's tokens must be the record's, else the decoder stops.
        """
        n = len(pub.tokens)
        rows = np.empty((n, 3), dtype=np.int32)
        if n:
            call("cuMemcpyDtoH", rows.ctypes.data, self.trace.ptr + 12 * (pub.step - n), rows.nbytes)
        if tuple(rows[:, 0].tolist()) != pub.tokens:
            raise CudaError(f"the step log disagrees with the published tokens of pointer {pub.pointer}")
        return float(sum(float(v) for v in rows[:, 2].view(np.float32)))

    def chain_launches(self, model: CudaModel, attention: AttentionForm, final_norm: bool = True) -> list[Launch]:
        """``model``'s forward pass of the forced chain this control block names (its tokens, first position and
        count), as both decode loops run it; ``final_norm``: as ``CudaModel.chain_launches`` takes it."""
        ctl = self.ctl.ptr
        return model.chain_launches(
            tokens_ptr=ctl + 4 * CTL["chain"],
            pos_ptr=ctl + 4 * CTL["chain_pos"],
            count_ptr=ctl + 4 * CTL["nchain"],
            attention=attention,
            final_norm=final_norm,
        )

    def published(self, start: int = 0) -> list[Published]:
        """Records the device has completed, from index ``start`` (safe while kernels run)."""
        w = self.out.words
        out = []
        for i in range(start, int(w[OUT_COUNT])):
            rec = w[OUT_HEADER + i * REC_WORDS : OUT_HEADER + (i + 1) * REC_WORDS].copy()
            n = int(rec[1])
            out.append(Published(int(rec[0]), tuple(int(t) for t in rec[4 : 4 + n]), int(rec[3])))
        return out

    def free(self) -> None:
        """Free the buffers; a state whose allocation failed part way frees what it had allocated."""
        for name in ("ctl", "cand", "cand_logit", "trace", "out"):
            buf = getattr(self, name, None)
            if buf is not None:
                buf.free()


class StepLaunches:
    """The launches of one grammar step after a forward pass: head (sparse or dense), then step, which ends with
    the next node's mask; the answer's first step (``first``) begins with the mask of its first node. The sparse
    head applies the final norm to the forward pass's last row itself, so the forward passes before it end without
    one (``forward_norm``); the first step's head reads the prefill's normalised row. ``conds``: the graph's
    conditional handles the step sets (the WHILE node's, and the IF node's that picks the chain's forward pass over
    the single token's; zeros outside a graph)."""

    def __init__(self, model: CudaModel, state: StepState, dense: bool, conds: tuple[int, int] = (0, 0)) -> None:
        k, c = model.module.kernel, model.config
        split = gemv_warps_per_row(c.vocab_size, c.hidden_size)
        assert split <= GEMV_WARPS
        self.mask = Launch(
            k("trie_mask"),
            (1, 1, 1),
            (TRIE_THREADS, 1, 1),
            [("ptr", state.ctl.ptr), ("ptr", state.cand.ptr), ("i32", state.cand_cap)],
        )

        def sparse_head(x: int, norm_w: int) -> Launch:
            return Launch(
                k("sparse_head"),
                (HEAD_SLOTS, 1, 1),
                (TRIE_THREADS, 1, 1),
                [
                    ("ptr", model.weights.lm_head.ptr),
                    ("ptr", x),
                    ("ptr", state.ctl.ptr),
                    ("ptr", state.cand.ptr),
                    ("ptr", state.cand_logit.ptr),
                    ("i32", c.hidden_size),
                    ("i32", split),
                    ("ptr", norm_w),
                    ("f32", float(c.rms_norm_eps)),
                ],
                shared_bytes=c.hidden_size * F32,
                label="sparse_head",
            )

        self.forward_norm = dense
        if dense:
            self.first_head = self.head = model.dense_head()
        else:
            self.first_head = sparse_head(model.xn.ptr, 0)
            self.head = sparse_head(model.x.ptr, model.weights.norm.ptr)
        self.step = Launch(
            k("trie_step"),
            (1, 1, 1),
            (TRIE_THREADS, 1, 1),
            [
                ("ptr", state.ctl.ptr),
                ("ptr", state.cand.ptr),
                ("i32", state.cand_cap),
                ("ptr", model.logits.ptr if dense else state.cand_logit.ptr),
                ("i32", int(dense)),
                ("ptr", state.trace.ptr),
                ("ptr", state.out.ptr),
                *(("u64", cond) for cond in conds),
            ],
        )

    @property
    def first(self) -> list[Launch]:
        """The answer's first step, on the prefill's hidden state."""
        return [self.mask, self.first_head, self.step]

    @property
    def launches(self) -> list[Launch]:
        """Every later step: the mask was made by the step before."""
        return [self.head, self.step]
