"""The CUDA engine beside Hugging Face transformers on the same weights, per catalog, batch 1.

Model: the Qwen3-1.7B shape with synthetic bf16 weights (seed 5) and the real Qwen3 tokenizer. Catalogs: the
42-tool example catalog (``examples/catalogs/workplace.json``, name and description per line) and a seeded
1,000-name ``service.verb_object`` catalog whose descriptions put the prompt over the default budget (a quarter
of the 40,960-token context), so the prompt policy lists names only. Intents: the first N of
``examples/eval/intents.jsonl``; k = 3. Every prompt is the catalog's chat-template prefix plus the request suffix.

Rows per catalog:

- ours: per-token decode time (median over intents of decode wall time / generated tokens, pointers streamed
  meanwhile) for graph loop + sparse head, graph loop + dense head + mask, host loop + sparse head; the
  unconstrained step (forward + dense head + argmax captured in a CUDA graph) at the same context; time to the
  first pointer (decode call to the first pointer event, prefix KV cached); prefill with the prefix KV cached
  (request suffix only) and without it (prefix + suffix).
- transformers: ``generate`` with a LogitsProcessor that walks the same trie through ``GrammarState`` (every
  logit -inf but the legal tokens; once the answer is complete, the STOP token), bf16, SDPA attention; eager
  (dynamic cache) and static cache + torch.compile. Per-token = (generate(T new tokens) - generate(1 new token))
  / (T - 1), T = the tokens our engine generated for that intent, medians of a few repeats.
- floor: bytes one step reads (bf16 weights; the dense head's matrix only where the head is dense; the KV cache
  at the answer's mean position, bf16 in both) over the device-to-device copy
  bandwidth measured in the same run.

    PYTHONPATH=. python3 bench/gpu_side_by_side.py --out results/bench_gpu_side_by_side.json
    PYTHONPATH=. python3 bench/gpu_side_by_side.py --report <run dir or json> --results results

Smoke test without a GPU (transformers rows only, tiny synthetic Qwen3):

    PYTHONPATH=. python3 bench/gpu_side_by_side.py --device cpu --shape tiny-qwen3 --intents 2
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import machine  # noqa: E402
from bench.compile import synthetic_names  # noqa: E402
from bench.gpu_forward import QWEN3_1_7B, copy_bandwidth, graph_ms, synthetic_weights  # noqa: E402
from decoder_service.engines.base import PointerEvent, SummaryEvent  # noqa: E402
from decoder_service.engines.catalog import PreparedCatalog, Tool, read_catalog_file  # noqa: E402
from decoder_service.engines.cuda.driver import cuda_available  # noqa: E402
from decoder_service.engines.cuda.forward import KV_ENTRY_BYTES  # noqa: E402
from decoder_service.engines.cuda.weights import weight_bytes  # noqa: E402
from decoder_service.engines.prompt import prepare_catalog, request_suffix_ids  # noqa: E402
from decoder_service.models.config import ModelConfig  # noqa: E402
from decoder_service.models.hf_config import config_to_hf  # noqa: E402
from decoder_service.models.synth import PRESETS, QWEN3_CHAT_TEMPLATE  # noqa: E402
from tests.decoder_service.engines.hf_cache import cache_argument  # noqa: E402
from tooltrie.grammar import GrammarState, load_tokenizer  # noqa: E402
from tooltrie.grammar.trie import CompiledTrie  # noqa: E402

CATALOG_FILE = REPO / "examples" / "catalogs" / "workplace.json"
INTENTS_FILE = REPO / "examples" / "eval" / "intents.jsonl"
RESULT_FILE = "bench_gpu_side_by_side.json"
SHAPES = {"qwen3-1.7b-shape": QWEN3_1_7B, "tiny-qwen3": PRESETS["tiny"]}
WEIGHT_SEED = 5
NAMES_SEED = 0
CONTEXT_LENGTH = QWEN3_1_7B.max_position_embeddings  # the prompt budget defaults to a quarter of it
# (loop, head), each with a forward pass after every token but the last: per-token time is a step's cost.
ENGINE_VARIANTS = (("graph", "sparse"), ("graph", "dense"), ("host", "sparse"))
# The product's default beside them: the answer's forced end taken without forward passes, the tokens forced after
# a chosen one fed through the same pass (the same answers).
DEFAULT = "graph/sparse/default"
GOAL_MS_PER_TOKEN = 0.80
GOAL_GAP_MS = 0.120
GOAL_HF_RATIO = 5.0


# -- catalogs and prompts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One catalog's prepared prompt, trie and request suffixes."""

    name: str
    tools: int
    catalog: PreparedCatalog
    intents: list[str]
    suffixes: list[list[int]]

    @property
    def trie(self) -> CompiledTrie:
        return self.catalog.trie

    @property
    def prefix(self) -> list[int]:
        return list(self.catalog.prefix_ids)

    def prompt(self, i: int) -> list[int]:
        return self.prefix + self.suffixes[i]


DESCRIPTIONS = (
    "{Verb} {obj} records in {service}; takes an id or a free-text query and returns the matching fields as JSON.",
    "{Verb} one or more {obj} items of the {service} account, with paging, filters and the caller's permissions.",
    "Use to {verb} {obj} data in {service}: accepts ids, names or filters; replies with status and timestamps.",
)


def names_catalog(n: int, seed: int = NAMES_SEED) -> list[Tool]:
    """``n`` seeded ``service.verb_object`` tools, each with a one-sentence description."""
    rng = random.Random(seed)
    tools = []
    for name in synthetic_names(n, seed):
        service, action = name.split(".", 1)
        verb, _, obj = action.partition("_")
        text = rng.choice(DESCRIPTIONS)
        tools.append(
            Tool(name, text.format(Verb=verb.capitalize(), verb=verb, obj=obj.replace("_", " "), service=service))
        )
    return tools


def load_intents(n: int) -> list[str]:
    rows = [json.loads(line) for line in INTENTS_FILE.read_text().splitlines() if line.strip()]
    return [row["intent"] for row in rows[:n]]


def build_cases(names: Sequence[str], n_intents: int, k: int) -> list[Case]:
    """The catalogs named ``workplace`` or ``names<N>``, prepared with the Qwen3 tokenizer and chat template."""
    tokenizer = load_tokenizer("qwen3")
    intents = load_intents(n_intents)
    cases = []
    for name in names:
        if name == "workplace":
            tools, _ = read_catalog_file(CATALOG_FILE)
            want_descriptions = True
        elif name.startswith("names") and name[5:].isdigit():
            tools = names_catalog(int(name[5:]))
            want_descriptions = False
        else:
            raise SystemExit(f"unknown catalog {name!r}; accepted: workplace, names<N> (e.g. names1000)")
        catalog = prepare_catalog(
            tools, tokenizer, QWEN3_CHAT_TEMPLATE, context_length=CONTEXT_LENGTH, catalog_id=f"bench-{name}"
        )
        if catalog.with_descriptions is not want_descriptions:
            raise SystemExit(
                f"catalog {name}: the prompt policy chose with_descriptions={catalog.with_descriptions} "
                f"({len(catalog.prefix_ids)} prefix tokens, budget {CONTEXT_LENGTH // 4}); this benchmark expects "
                f"{want_descriptions}"
            )
        suffixes = [request_suffix_ids(catalog, intent, k) for intent in intents]
        cases.append(Case(name, len(tools), catalog, intents, suffixes))
    return cases


def catalog_info(case: Case) -> dict[str, Any]:
    stats = case.trie.stats
    return {
        "tools": case.tools,
        "with_descriptions": case.catalog.with_descriptions,
        "prompt": "name: description per line" if case.catalog.with_descriptions else "names only",
        "prefix_tokens": len(case.catalog.prefix_ids),
        "suffix_tokens_median": statistics.median(len(s) for s in case.suffixes),
        "prompt_budget_tokens": CONTEXT_LENGTH // 4,
        "trie_nodes": case.trie.n_nodes,
        "trie_max_out_degree": stats.max_out_degree,
        "trie_longest_name_tokens": case.trie.longest_path,
        "trie_device_bytes": stats.device_bytes,
    }


def answer_names(trie: CompiledTrie, k: int, tokens: Sequence[int]) -> list[str]:
    """The names a generated token sequence spells, walked through the grammar (tokens after STOP ignored)."""
    state, names = GrammarState(trie, k), []
    for token in tokens:
        if state.done:
            break
        pointer = state.advance(int(token))
        if pointer is not None:
            names.append(trie.names[pointer])
    return names


# -- our CUDA engine --------------------------------------------------------------------------------------


def _decode(engine: Any, case: Case, i: int, k: int, cache_key: str | None) -> tuple[list[str], SummaryEvent, float]:
    """One answer: pointer names, the summary, seconds from the decode call to the first pointer event."""
    t0 = time.perf_counter()
    first, names, summary = None, [], None
    for event in engine.decode_ids(case.trie, k, case.prefix, case.suffixes[i], cache_key=cache_key):
        if isinstance(event, PointerEvent):
            if first is None:
                first = time.perf_counter() - t0
            names.append(event.name)
        else:
            summary = event
    assert isinstance(summary, SummaryEvent) and first is not None
    return names, summary, first


def engine_variant(engine: Any, case: Case, k: int) -> dict[str, Any]:
    """Every intent once after a warm-up answer (graph capture; the prefix KV on a catalog's first call)."""
    key = case.catalog.cache_key
    _, warm, _ = _decode(engine, case, 0, k, key)
    per_token, per_pass, tokens, passes, answers, first, prefill, prompt_tokens, streamed = ([] for _ in range(9))
    for i in range(len(case.suffixes)):
        names, s, first_s = _decode(engine, case, i, k, key)
        streamed.append(engine.last_streamed / k)
        assert s.prefix_cached, "the prefix KV should be cached after the warm-up answer"
        per_token.append(s.decode_seconds / s.tokens_generated)
        per_pass.append(s.decode_seconds / max(s.forward_passes, 1))
        tokens.append(s.tokens_generated)
        passes.append(s.forward_passes)
        answers.append(names)
        first.append(first_s)
        prefill.append(s.prefill_seconds)
        prompt_tokens.append(s.prompt_tokens)
    return {
        "ms_per_token": 1e3 * statistics.median(per_token),
        "ms_per_token_min": 1e3 * min(per_token),
        "ms_per_forward_pass": 1e3 * statistics.median(per_pass),
        "tokens": tokens,
        "forward_passes": passes,
        "prompt_tokens": prompt_tokens,
        "answers": answers,
        "first_pointer_ms": 1e3 * statistics.median(first),
        "prefill_cached_ms": 1e3 * statistics.median(prefill),
        "warmup_prefix_cached": warm.prefix_cached,
        "warmup_prefill_ms": 1e3 * warm.prefill_seconds,
        "pointers_streamed_before_loop_end": statistics.mean(streamed),
    }


def engine_catalog(engine: Any, case: Case, k: int, prefill_repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for loop, head in ENGINE_VARIANTS:
        # drivers are kept per (loop, head); the weights are uploaded once
        engine.loop, engine.head, engine.forced_tail, engine.forced_chains = loop, head, False, False
        out[f"{loop}/{head}"] = row = engine_variant(engine, case, k)
        print(
            f"  ours {case.name:10s} {loop:5s} {head:6s} {row['ms_per_token']:8.3f} ms/token, first pointer "
            f"{row['first_pointer_ms']:.2f} ms",
            flush=True,
        )
    engine.loop, engine.head, engine.forced_tail, engine.forced_chains = "graph", "sparse", True, True
    out[DEFAULT] = row = engine_variant(engine, case, k)
    print(
        f"  ours {case.name:10s} graph sparse, default (forced tail, chains): {row['ms_per_token']:8.3f} ms/token, "
        f"{row['ms_per_forward_pass']:.3f} ms/forward pass, {statistics.mean(row['forward_passes']):.1f} passes for "
        f"{statistics.mean(row['tokens']):.1f} tokens",
        flush=True,
    )
    ref = out["graph/sparse"]
    out["all_variants_same_answers"] = all(
        out[v]["answers"] == ref["answers"] for v in [*(f"{lp}/{hd}" for lp, hd in ENGINE_VARIANTS), DEFAULT]
    )
    # Prefill without the prefix KV: no cache key, so the prefix is computed on every call.
    uncached = []
    for r in range(prefill_repeats):
        _, s, _ = _decode(engine, case, r % len(case.suffixes), k, None)
        assert not s.prefix_cached
        uncached.append(s.prefill_seconds)
    out["prefill_uncached_ms"] = 1e3 * statistics.median(uncached)
    out["prefill_cached_ms"] = ref["prefill_cached_ms"]
    out["first_pointer_ms"] = ref["first_pointer_ms"]
    # The unconstrained step at the answer's mean position, as a straight-line graph.
    position = int(statistics.median(ref["prompt_tokens"]) + statistics.median(ref["tokens"]) / 2)
    out["context_positions"] = position
    model = engine.model
    model.set_decode_position(position)
    out["unconstrained_graph_ms_per_token"] = graph_ms(model.stream, model.decode_launches)
    print(
        f"  ours {case.name:10s} unconstrained step (graph) {out['unconstrained_graph_ms_per_token']:.3f} ms; "
        f"prefill cached {out['prefill_cached_ms']:.1f} ms, not cached {out['prefill_uncached_ms']:.1f} ms",
        flush=True,
    )
    return out


def engine_section(
    cfg: ModelConfig, weights: dict[str, np.ndarray], cases: list[Case], k: int, prefill_repeats: int
) -> dict[str, Any]:
    from decoder_service.engines.cuda.engine import CudaEngine, cubin_path
    from decoder_service.engines.cuda.module import Module
    from tooltrie.cuda_build import build_cubin

    module = Module(cubin_path() or build_cubin())
    longest = max(len(c.prefix) + max(map(len, c.suffixes)) + k * (c.trie.longest_path + 1) for c in cases)
    max_context = -(-(longest + 64) // 256) * 256
    engine = CudaEngine(cfg, weights, head="sparse", loop="graph", module=module, max_context=max_context)
    try:
        bandwidth = copy_bandwidth(engine.stream)
        out: dict[str, Any] = {"max_context": max_context, "copy_bandwidth_Bps": bandwidth, "catalogs": {}}
        print(f"  device-to-device copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)", flush=True)
        for case in cases:
            out["catalogs"][case.name] = engine_catalog(engine, case, k, prefill_repeats)
    finally:
        engine.free()
    return out


def floor(cfg: ModelConfig, bandwidth: float, positions: int) -> dict[str, float]:
    """Bytes one decode step must read, over the copy bandwidth."""
    dense = weight_bytes(cfg)  # every matrix and norm; the tied embedding once, as the head
    head = cfg.vocab_size * cfg.hidden_size * 2
    kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * KV_ENTRY_BYTES * positions
    return {
        "context_positions": positions,
        "weight_bytes_dense_head": dense,
        "weight_bytes_sparse_head": dense - head,
        "kv_bytes": kv,
        "floor_ms_sparse": (dense - head + kv) / bandwidth * 1e3,
        "floor_ms_dense": (dense + kv) / bandwidth * 1e3,
    }


# -- transformers ---------------------------------------------------------------------------------------


def hf_model(cfg: ModelConfig, weights: dict[str, np.ndarray], device: str) -> Any:
    """Qwen3ForCausalLM in bf16 on ``device`` holding exactly ``weights`` (bf16 bits)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hf = config_to_hf(cfg)
    hf["max_position_embeddings"] = max(hf["max_position_embeddings"], CONTEXT_LENGTH)
    config = Qwen3Config(**hf, attn_implementation="sdpa")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    state = {
        name: torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)
        for name, bits in weights.items()
    }
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"weights do not match the transformers model: missing {missing}, unexpected {unexpected}")
    if cfg.tie_word_embeddings and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise RuntimeError("tie_word_embeddings is set but transformers did not tie lm_head to the embedding")
    model.eval()  # parameters bf16 (built under that default dtype); RoPE's inv_freq stays fp32, as HF computes it
    model.generation_config.eos_token_id = None  # answers pass the STOP token; timing runs generate exactly T
    model.generation_config.bos_token_id = None
    return model


class MaskCache:
    """Device index tensors of the grammar's legal-token arrays (the runtime memoises them per node)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._tensors: dict[int, tuple[np.ndarray, Any]] = {}

    def get(self, legal: np.ndarray) -> Any:
        import torch

        hit = self._tensors.get(id(legal))
        if hit is None or hit[0] is not legal:
            hit = (legal, torch.tensor(np.asarray(legal, dtype=np.int64), device=self.device))
            self._tensors[id(legal)] = hit  # the array is kept, so its id stays its own
        return hit[1]


def trie_processor(trie: CompiledTrie, k: int, masks: MaskCache) -> Any:
    """A LogitsProcessor enforcing the trie: -inf everywhere but the legal tokens; after STOP, STOP again."""
    import torch
    from transformers import LogitsProcessor

    class TrieLogitsProcessor(LogitsProcessor):
        def __init__(self) -> None:
            self.state = GrammarState(trie, k)
            self.prompt_length: int | None = None

        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            if self.prompt_length is None:
                self.prompt_length = input_ids.shape[1]
            elif not self.state.done:
                self.state.advance(int(input_ids[0, -1]))
            out = torch.full_like(scores, float("-inf"))
            if self.state.done:
                out[:, trie.stop_token] = 0.0
            else:
                legal = masks.get(self.state.legal_tokens())
                out[:, legal] = scores[:, legal]
            return out

    return TrieLogitsProcessor()


class HfRunner:
    """``generate`` with the trie processor; static mode reuses one StaticCache (reset before every call)."""

    def __init__(self, model: Any, device: str) -> None:
        self.model, self.device = model, device
        self.masks = MaskCache(device)
        self.cache_arg = cache_argument(model)

    def sync(self) -> None:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def static_cache(self, max_cache_len: int) -> Any:
        """A StaticCache of ``max_cache_len`` positions, batch 1 (constructor arguments differ across versions)."""
        import inspect

        from transformers import StaticCache

        offered = {
            "config": self.model.config,
            "max_cache_len": max_cache_len,
            "max_batch_size": 1,
            "device": self.model.device,
            "dtype": self.model.dtype,
        }
        params = inspect.signature(StaticCache.__init__).parameters
        return StaticCache(**{name: value for name, value in offered.items() if name in params})

    def generate(
        self, ids: list[int], trie: CompiledTrie, k: int, new_tokens: int, stop: bool, cache: Any = None
    ) -> tuple[float, list[int]]:
        """(seconds, generated ids). ``stop``: end at the answer's STOP; else exactly ``new_tokens`` tokens.
        ``cache``: a StaticCache to reuse (reset first); None: generate's default dynamic cache."""
        import torch
        from transformers import LogitsProcessorList

        input_ids = torch.tensor([ids], device=self.device)
        kwargs: dict[str, Any] = {
            "max_new_tokens": new_tokens,
            "do_sample": False,
            "logits_processor": LogitsProcessorList([trie_processor(trie, k, self.masks)]),
            "attention_mask": torch.ones_like(input_ids),
            "pad_token_id": trie.stop_token,
        }
        if stop:
            kwargs["eos_token_id"] = trie.stop_token
        if cache is not None:
            cache.reset()
            kwargs[self.cache_arg] = cache
        self.sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(input_ids, **kwargs)
        self.sync()
        seconds = time.perf_counter() - t0
        generated = out[0, len(ids) :].tolist()
        if not stop and len(generated) != new_tokens:
            raise RuntimeError(f"generate returned {len(generated)} tokens, {new_tokens} asked")
        return seconds, generated


def hf_catalog(
    runner: HfRunner, case: Case, k: int, static: bool, tokens: list[int], repeats: int, timing_intents: int
) -> dict[str, Any]:
    trie = case.trie
    max_steps = k * (trie.longest_path + 1)
    longest_answer = max(max_steps, *tokens)
    n = len(case.suffixes)
    longest = max(range(n), key=lambda i: len(case.suffixes[i]))
    # Static mode: one cache sized for the catalog's longest prompt and answer, reused by every call, so that
    # the compiled decode step sees one shape and one set of cache addresses.
    cache_len = len(case.prompt(longest)) + longest_answer
    cache = runner.static_cache(cache_len) if static else None
    warmup = [runner.generate(case.prompt(longest), trie, k, longest_answer, False, cache)[0]]
    if static:  # the first call compiles; CUDA graphs are recorded on the next ones
        warmup += [runner.generate(case.prompt(longest), trie, k, longest_answer, False, cache)[0] for _ in range(2)]
    answers = [
        answer_names(trie, k, runner.generate(case.prompt(i), trie, k, max_steps, True, cache)[1]) for i in range(n)
    ]
    per_token, rows = [], []
    for i in range(min(timing_intents, n)):
        one, full = [], []
        for _ in range(repeats):
            one.append(runner.generate(case.prompt(i), trie, k, 1, False, cache)[0])
            full.append(runner.generate(case.prompt(i), trie, k, tokens[i], False, cache)[0])
        ms = 1e3 * (statistics.median(full) - statistics.median(one)) / (tokens[i] - 1)
        per_token.append(ms)
        rows.append(
            {
                "intent": i,
                "tokens": tokens[i],
                "generate_1_ms": 1e3 * statistics.median(one),
                "generate_T_ms": 1e3 * statistics.median(full),
                "ms_per_token": ms,
            }
        )
    return {
        "ms_per_token": statistics.median(per_token),
        "timing": rows,
        "static_cache_len": cache_len if static else None,
        "warmup_calls_s": warmup,
        "first_call_s": warmup[0],
        "answers": answers,
    }


def hf_section(
    cfg: ModelConfig,
    weights: dict[str, np.ndarray],
    cases: list[Case],
    k: int,
    device: str,
    modes: list[str],
    engine_tokens: dict[str, list[int]],
    fixed_tokens: int,
    repeats: int,
    timing_intents: int,
) -> dict[str, Any]:
    import torch
    import transformers

    t0 = time.perf_counter()
    model = hf_model(cfg, weights, device)
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": "bfloat16",
        "attention": getattr(model.config, "_attn_implementation", None) or "default",
        "setup_s": time.perf_counter() - t0,
        "timed_intents": min(timing_intents, len(cases[0].suffixes)),
        "repeats": repeats,
        "fixed_tokens": None if engine_tokens else fixed_tokens,
        "modes": {},
    }
    runner = HfRunner(model, device)
    for mode in modes:
        static = mode == "static"
        compile_path, compiled = "none (dynamic cache, eager)", False
        if static:
            if not device.startswith("cuda"):
                compile_path = "none: transformers compiles the decode step on GPUs only"
            elif hasattr(model, "get_compiled_call"):  # generate compiles the decode step itself (static cache)
                compile_path = "generate's own torch.compile of the decode step (StaticCache; CompileConfig defaults)"
                compiled = True
            else:
                model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
                compile_path = 'model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)'
                compiled = True
        rows: dict[str, Any] = {"compile": compile_path, "compiled": compiled, "catalogs": {}}
        for case in cases:
            tokens = engine_tokens.get(case.name) or [fixed_tokens] * len(case.suffixes)
            row = hf_catalog(runner, case, k, static, tokens, repeats, timing_intents)
            rows["catalogs"][case.name] = row
            print(
                f"  transformers {mode:6s} {case.name:10s} {row['ms_per_token']:8.3f} ms/token "
                f"(first call {row['first_call_s']:.1f} s)",
                flush=True,
            )
        out["modes"][mode] = rows
        if "forward" in vars(model):
            del model.forward
    del model, runner
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


# -- the run ----------------------------------------------------------------------------------------------


def _portable(arg: str) -> str:
    """A command-line argument as anyone can repeat it: an absolute output path becomes ``<dir>/<name>``."""
    return f"<dir>/{Path(arg).name}" if Path(arg).is_absolute() else arg


def _portable_command(command: str) -> str:
    return " ".join(_portable(arg) for arg in command.split())


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        ok, name = cuda_available()
        if ok:
            return name
        import torch

        return torch.cuda.get_device_name()
    return f"{machine.cpu_model()} (CPU)"


def run(args: argparse.Namespace) -> dict[str, Any]:
    info = machine.describe()
    cfg = SHAPES[args.shape]
    names = [n.strip() for n in args.catalogs.split(",") if n.strip()]
    cases = build_cases(names, args.intents, args.k)
    try:
        from tooltrie.cuda_build import cuda_sources_sha256

        sha = cuda_sources_sha256()
    except (ImportError, OSError):
        sha = "?"
    result: dict[str, Any] = {
        "benchmark": "gpu_side_by_side",
        "date": info["date"],
        "commit": info["commit"],
        "command": "python3 " + " ".join(["bench/gpu_side_by_side.py", *map(_portable, sys.argv[1:])]),
        "device": device_name(args.device),
        "cuda_sources_sha256": sha,
        "model": {"shape": args.shape, "weights": f"synthetic bf16 (seed {WEIGHT_SEED})", "config": vars_of(cfg)},
        "tokenizer": "qwen3",
        "k": args.k,
        "intents": len(cases[0].intents),
        "catalogs": {c.name: catalog_info(c) for c in cases},
    }
    for c in cases:
        i = result["catalogs"][c.name]
        print(
            f"catalog {c.name}: {i['tools']} tools, {i['prompt']}, prefix {i['prefix_tokens']} tokens, "
            f"trie max out-degree {i['trie_max_out_degree']}",
            flush=True,
        )
    t0 = time.perf_counter()
    weights = synthetic_weights(cfg, seed=WEIGHT_SEED)
    result["weights_s"] = time.perf_counter() - t0

    engine_tokens: dict[str, list[int]] = {}
    if args.device.startswith("cuda") and not args.skip_engine:
        ok, reason = cuda_available()
        if not ok:
            raise SystemExit(f"no usable CUDA device for the engine: {reason} (or pass --skip-engine)")
        print("our CUDA engine", flush=True)
        result["engine"] = engine = engine_section(cfg, weights, cases, args.k, args.prefill_repeats)
        result["floor"] = {}
        for c in cases:
            row = engine["catalogs"][c.name]
            engine_tokens[c.name] = row["graph/sparse"]["tokens"]
            result["floor"][c.name] = floor(cfg, engine["copy_bandwidth_Bps"], row["context_positions"])
    else:
        result["engine"] = {"skipped": "no CUDA device requested" if not args.skip_engine else "--skip-engine"}

    if not args.skip_hf:
        modes = ["eager"] + ([] if args.skip_compile else ["static"])
        print("transformers generate + trie LogitsProcessor", flush=True)
        result["hf"] = hf_section(
            cfg,
            weights,
            cases,
            args.k,
            args.device,
            modes,
            engine_tokens,
            args.hf_tokens,
            args.hf_repeats,
            args.hf_timing_intents,
        )
    else:
        result["hf"] = {"skipped": "--skip-hf"}
    result["agreement"] = agreement(result)
    return result


def vars_of(cfg: ModelConfig) -> dict[str, Any]:
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}


def agreement(result: dict[str, Any]) -> dict[str, Any]:
    """Per catalog: whether our variants agree, and on how many intents transformers named the same pointers."""
    out: dict[str, Any] = {}
    eng = result["engine"].get("catalogs", {})
    hf = result["hf"].get("modes", {})
    for name in result["catalogs"]:
        row: dict[str, Any] = {}
        ours = eng.get(name, {}).get("graph/sparse", {}).get("answers")
        if name in eng:
            row["our_variants_agree"] = eng[name]["all_variants_same_answers"]
        for mode, m in hf.items():
            theirs = m["catalogs"][name]["answers"]
            if ours is not None:
                row[f"hf_{mode}_same_as_ours"] = sum(a == b for a, b in zip(ours, theirs, strict=True))
            row["intents"] = len(theirs)
        if {"eager", "static"} <= set(hf):
            e, s = hf["eager"]["catalogs"][name]["answers"], hf["static"]["catalogs"][name]["answers"]
            row["hf_eager_same_as_static"] = sum(a == b for a, b in zip(e, s, strict=True))
        out[name] = row
    return out


# -- tables -----------------------------------------------------------------------------------------------


def _pct(floor_ms: float | None, ms: float | None) -> str:
    return f"{100 * floor_ms / ms:.0f}%" if floor_ms and ms else "-"


def _ms(value: float | None) -> str:
    return f"{value:.3f} ms" if value is not None else "-"


def catalog_rows(result: dict[str, Any], name: str) -> list[tuple[str, str, str]]:
    """(what, per token, share of the bandwidth floor) for one catalog."""
    eng = result["engine"].get("catalogs", {}).get(name)
    fl = result.get("floor", {}).get(name, {})
    rows: list[tuple[str, str, str]] = []
    if eng:
        for (loop, head), label in zip(
            ENGINE_VARIANTS,
            ("ours: graph loop, sparse head", "ours: graph loop, dense head + mask", "ours: host loop, sparse head"),
            strict=True,
        ):
            ms = eng[f"{loop}/{head}"]["ms_per_token"]
            rows.append((label, _ms(ms), _pct(fl.get(f"floor_ms_{head}"), ms)))
        if DEFAULT in eng:  # not a step's cost: no share of the floor
            tail = eng[DEFAULT]
            rows.append(
                (
                    "ours, default: graph, sparse, forced tail and chains "
                    f"({statistics.mean(tail['forward_passes']):.1f} passes / {statistics.mean(tail['tokens']):.1f}"
                    " tokens)",
                    _ms(tail["ms_per_token"]),
                    "-",
                )
            )
        ms = eng["unconstrained_graph_ms_per_token"]
        rows.append(
            (
                "ours: unconstrained step (forward + dense head + argmax, graph)",
                _ms(ms),
                _pct(fl.get("floor_ms_dense"), ms),
            )
        )
    for mode, m in result["hf"].get("modes", {}).items():
        row = m["catalogs"].get(name)
        if row:
            label = "transformers eager + mask"
            if mode == "static":
                label = f"transformers static cache{' + torch.compile' if m['compiled'] else ' (not compiled)'} + mask"
            rows.append((label, _ms(row["ms_per_token"]), _pct(fl.get("floor_ms_dense"), row["ms_per_token"])))
    if fl:
        rows.append(("floor: bf16 weights without the head matrix + bf16 KV", _ms(fl["floor_ms_sparse"]), "-"))
        rows.append(("floor: bf16 weights with the head matrix + bf16 KV", _ms(fl["floor_ms_dense"]), "-"))
    return rows


def goals(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(goal, catalog, measured, met) for the goals this benchmark can check."""
    out = []
    static_mode = result["hf"].get("modes", {}).get("static", {})
    static = static_mode.get("catalogs", {}) if static_mode.get("compiled") else {}
    for name, eng in result["engine"].get("catalogs", {}).items():
        ours = eng["graph/sparse"]["ms_per_token"]
        out.append(
            (
                f"constrained (graph + sparse, bf16 weights) <= {GOAL_MS_PER_TOKEN:.2f} ms/token",
                name,
                f"{ours:.3f} ms",
                "yes" if ours <= GOAL_MS_PER_TOKEN else "no",
            )
        )
        gap = eng["unconstrained_graph_ms_per_token"] - ours
        out.append(
            (
                f"constrained faster than unconstrained by >= {1e3 * GOAL_GAP_MS:.0f} us",
                name,
                f"{1e3 * gap:+.0f} us",
                "yes" if gap >= GOAL_GAP_MS else "no",
            )
        )
        if name in static:
            compared = [("a forward pass per token", ours)]
            if DEFAULT in eng:
                compared.append(
                    ("per generated token, the default: forced tail and chains", eng[DEFAULT]["ms_per_token"])
                )
            for how, ms in compared:
                ratio = static[name]["ms_per_token"] / ms
                out.append(
                    (
                        f">= {GOAL_HF_RATIO:.0f}x faster than transformers static cache + compile with the mask "
                        f"({how})",
                        name,
                        f"{ratio:.2f}x",
                        "yes" if ratio >= GOAL_HF_RATIO else "no",
                    )
                )
    return out


def print_tables(result: dict[str, Any]) -> None:
    model = result["model"]
    print(
        f"\n{result['device']}, commit {result['commit']}, {model['shape']} ({model['weights']}), "
        f"k = {result['k']}, {result['intents']} intents"
    )
    eng = result["engine"].get("catalogs", {})
    for name, info in result["catalogs"].items():
        print(f"\n{name}: {info['tools']} tools, {info['prompt']}, prefix {info['prefix_tokens']} tokens")
        for what, ms, pct in catalog_rows(result, name):
            print(f"  {what:66s} {ms:>12s} {pct:>6s}")
        if name in eng:
            e = eng[name]
            print(f"  {'time to first pointer (prefix KV cached)':66s} {_ms(e['first_pointer_ms']):>12s}")
            print(f"  {'prefill, prefix KV cached (request suffix only)':66s} {_ms(e['prefill_cached_ms']):>12s}")
            print(f"  {'prefill, prefix KV not cached (prefix + suffix)':66s} {_ms(e['prefill_uncached_ms']):>12s}")
        print(f"  {answers_text(result['agreement'].get(name, {}))}")
    for goal, name, measured, met in goals(result):
        print(f"goal: {goal} [{name}]: {measured} -> {met}")


def shape_text(model: dict[str, Any]) -> str:
    c = model["config"]
    return (
        f"{model['shape']} ({c['num_layers']} layers, hidden {c['hidden_size']}, MLP {c['intermediate_size']}, "
        f"{c['num_heads']} query / {c['num_kv_heads']} KV heads of {c['head_dim']}, vocabulary {c['vocab_size']}, "
        f"tied head {'yes' if c['tie_word_embeddings'] else 'no'})"
    )


def answers_text(agree: dict[str, Any]) -> str:
    n = agree.get("intents")
    parts = []
    if "our_variants_agree" in agree:
        parts.append(f"our four variants {'named the same pointers' if agree['our_variants_agree'] else 'DIFFER'}")
    for mode in ("eager", "static"):
        if f"hf_{mode}_same_as_ours" in agree:
            parts.append(
                f"transformers {mode} named the same pointers as ours on {agree[f'hf_{mode}_same_as_ours']} "
                f"of {n} intents"
            )
    if "hf_eager_same_as_static" in agree:
        parts.append(f"transformers eager and static agree on {agree['hf_eager_same_as_static']} of {n}")
    return "Answers: " + "; ".join(parts) + "." if parts else ""


def render_markdown(result: dict[str, Any], env: list[str], results_dir: Path = Path("results")) -> str:
    sha = next((line.split()[1] for line in env if line.startswith("cuda_sources_sha256")), None)
    versions = next((line for line in env if line.startswith("python ")), None)
    hf = result["hf"]
    lines = [
        "# Side by side on the GPU: our CUDA engine and transformers on the same weights, batch 1",
        "",
        f"- date: {env[0] if env else result['date']}",
        f"- commit: {result['commit']}",
        f"- device: {env[1] if len(env) > 1 else result['device']}",
        f"- cuda/ sources sha256: `{sha or result.get('cuda_sources_sha256', '?')}`",
    ]
    if versions:
        lines.append(f"- versions: {versions}")
    if "transformers" in hf:
        lines.append(f"- transformers {hf['transformers']}, torch {hf['torch']} ({hf['dtype']}, {hf['attention']})")
    lines += [
        "- command: `OUT=<dir> scripts/gpu_run.sh` from the repository root (its side stage runs "
        f"`{result['command']}`), then "
        f"`python3 bench/gpu_side_by_side.py --report <dir> --results {results_dir.as_posix()}`",
        "",
        f"Model: {shape_text(result['model'])}; weights {result['model']['weights']}; "
        f"the Qwen3 tokenizer; k = {result['k']}; the first {result['intents']} intents of "
        "`examples/eval/intents.jsonl`. Our engine: bf16 weights and KV cache, fp32 activations. transformers: bf16.",
        "",
        "| catalog | tools | prompt | prefix tokens | request suffix (median) | trie max out-degree |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, info in result["catalogs"].items():
        lines.append(
            f"| {name} | {info['tools']} | {info['prompt']} | {info['prefix_tokens']} "
            f"| {info['suffix_tokens_median']:.0f} | {info['trie_max_out_degree']} |"
        )
    eng = result["engine"].get("catalogs", {})
    if eng:
        bw = result["engine"]["copy_bandwidth_Bps"] / 1e12
        lines += ["", f"Device-to-device copy bandwidth in this run: {bw:.2f} TB/s (read + write)."]
    for name in result["catalogs"]:
        lines += [
            "",
            f"## {name}: decode time per token",
            "",
            "| what | per token | floor / time |",
            "| --- | --- | --- |",
        ]
        lines += [f"| {what} | {ms} | {pct} |" for what, ms, pct in catalog_rows(result, name)]
        if name in eng:
            e = eng[name]
            lines += [
                "",
                "| latency | value |",
                "| --- | --- |",
                f"| time to first pointer (decode call to the first pointer event, prefix KV cached) "
                f"| {_ms(e['first_pointer_ms'])} |",
                f"| the same, the default (forced tail and chains) "
                f"| {_ms(e.get(DEFAULT, {}).get('first_pointer_ms'))} |",
                f"| prefill with the prefix KV cached (request suffix only) | {_ms(e['prefill_cached_ms'])} |",
                f"| prefill without it (prefix + suffix) | {_ms(e['prefill_uncached_ms'])} |",
                f"| tokens per answer (mean) | {statistics.mean(e['graph/sparse']['tokens']):.1f} |",
                f"| context at the answer's mean position (floor, unconstrained step) | {e['context_positions']} |",
            ]
        for mode, m in hf.get("modes", {}).items():
            row = m["catalogs"].get(name)
            if row and mode == "static":
                calls = ", ".join(f"{t:.1f} s" for t in row["warmup_calls_s"])
                lines.append(
                    f"\ntransformers static cache, {row['static_cache_len']} positions; compile: {m['compile']}; "
                    f"warm-up calls (longest prompt, {len(row['warmup_calls_s'])} calls): {calls}."
                )
        agree = result["agreement"].get(name, {})
        if agree:
            lines += ["", answers_text(agree)]
    table = goals(result)
    if table:
        lines += ["", "## Goals", "", "| goal | catalog | measured | met |", "| --- | --- | --- | --- |"]
        lines += [f"| {g} | {n} | {m} | {ok} |" for g, n, m, ok in table]
    lines += [
        "",
        "Notes:",
        "- Our per-token time is an answer's decode wall time (first step to the summary, pointers streamed to the",
        "  host meanwhile) over its generated tokens; the median over the intents after one warm-up answer. The",
        "  rows with a floor share run a forward pass after every token but the last, as transformers does; the",
        "  default row takes the answer's forced end (the tokens after which the grammar leaves one legal token at",
        "  every step) without forward passes and feeds the tokens forced after a chosen one (up to 4 in all)",
        "  through one pass, so its time per generated token is not a step's cost.",
        "- transformers per token: (generate of T tokens - generate of 1 token) / (T - 1), T = our engine's token",
        "  count for that intent (a fixed T where our engine did not run); each generate prefills the whole prompt",
        "  (no prefix cache), which cancels out in the difference.",
        "  The LogitsProcessor reads the last token back each step to walk the grammar on the host.",
        f"  Timed on the first {hf.get('timed_intents', '-')} intents, medians of {hf.get('repeats', '-')} repeats"
        + (f", T = {hf['fixed_tokens']}." if hf.get("fixed_tokens") else "."),
        "- The unconstrained step is its captured CUDA graph replayed back to back, timed with events (kernel time,",
        "  no host work), at the answer's mean position; the constrained rows are wall times with the host in them.",
        "- Floor: bf16 weights (without the head matrix for the sparse head) plus the KV cache at the answer's mean",
        "  position, over the copy bandwidth; floor / time is the share of that bandwidth a row reaches.",
        "- transformers' answers may differ from ours: bf16 activations against our fp32 ones on random weights.",
    ]
    return "\n".join(lines) + "\n"


def write_report(run_dir: Path, results_dir: Path) -> None:
    """Render results/gpu_side_by_side.{md,json} from a run folder (or the JSON file itself) and its env.txt."""
    path = run_dir / RESULT_FILE if run_dir.is_dir() else run_dir
    # The commit is this checkout's, as in the other reports: commit, then run the GPU stages on a copy of the tree.
    result = json.loads(path.read_text()) | {"commit": machine.git_commit()}
    result["command"] = _portable_command(result["command"])
    env_file = path.parent / "env.txt"
    env = env_file.read_text().splitlines() if env_file.exists() else []
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "gpu_side_by_side.json").write_text(json.dumps(result | {"env": env}, indent=2) + "\n")
    (results_dir / "gpu_side_by_side.md").write_text(render_markdown(result, env, results_dir))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results") / RESULT_FILE)
    parser.add_argument("--report", type=Path, help="render --results/gpu_side_by_side.md from a run folder or JSON")
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--shape", choices=list(SHAPES), default="qwen3-1.7b-shape")
    parser.add_argument("--device", default="cuda", help="cuda (everything) or cpu (transformers rows only)")
    parser.add_argument("--catalogs", default="workplace,names1000", help="comma-separated: workplace, names<N>")
    parser.add_argument("--intents", type=int, default=10)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--prefill-repeats", type=int, default=3, help="decodes without the prefix KV per catalog")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--skip-compile", action="store_true", help="transformers eager only")
    parser.add_argument("--hf-timing-intents", type=int, default=3, help="intents timed per transformers mode")
    parser.add_argument("--hf-repeats", type=int, default=3)
    parser.add_argument("--hf-tokens", type=int, default=12, help="T when our engine's token counts are absent")
    args = parser.parse_args()
    if args.report:
        write_report(args.report, args.results)
        return 0
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_tables(result)
    print(f"\nwrote {args.out}")
    agree = [row.get("our_variants_agree", True) for row in result["agreement"].values()]
    return 0 if all(agree) else 1


if __name__ == "__main__":
    sys.exit(main())
