"""Decode speed of the CUDA engine at batch 1 on a Qwen3-1.7B-shaped model (random bf16 weights, 200-token
prompt), beside the memory floor measured in the same run.

Reports: host-loop time per token (Python launches every kernel, then reads the argmax back), kernel-only
time per token (the same launch list captured once into a CUDA graph and replayed, timed with events),
the dense head GEMV alone, device-to-device copy bandwidth, and the floor (weights + KV bytes / bandwidth).

    PYTHONPATH=. python3 bench/gpu_forward.py --out results/bench_gpu_forward.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import code_identity_lines, git_commit, gpu_missing, run_env  # noqa: E402
from decoder_service.engines.cuda import driver  # noqa: E402
from decoder_service.engines.cuda.driver import Event, Stream, call  # noqa: E402
from decoder_service.engines.cuda.forward import (  # noqa: E402
    KV_ENTRY_BYTES,
    SHORT_ATTENTION_POSITIONS,
    CudaModel,
    gemv_groups,
)
from decoder_service.engines.cuda.memory import DeviceBuffer, to_bf16_bits  # noqa: E402
from decoder_service.engines.cuda.module import Launch, Module  # noqa: E402
from decoder_service.engines.cuda.weights import weight_bytes  # noqa: E402
from decoder_service.models.config import ModelConfig  # noqa: E402
from decoder_service.models.weights import expected_shapes  # noqa: E402
from tooltrie.cuda_build import build_cubin, cuda_sources_sha256, find_nvcc  # noqa: E402

QWEN3_1_7B = ModelConfig("qwen3", 151936, 2048, 6144, 28, 16, 8, 128, 1e-6, 1e6, 40960, True)


def synthetic_weights(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """normal(0, 0.02) matrices and 1 + normal(0, 0.1) norms as bf16 bits; drawn on the GPU with torch if present."""
    try:
        import torch

        gen = torch.Generator(device="cuda").manual_seed(seed)

        def draw(shape: tuple[int, ...], scale: float, offset: float) -> np.ndarray:
            t = torch.randn(shape, generator=gen, device="cuda") * scale + offset
            return t.to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)
    except (ImportError, RuntimeError):
        rng = np.random.default_rng(seed)

        def draw(shape: tuple[int, ...], scale: float, offset: float) -> np.ndarray:
            return to_bf16_bits(rng.standard_normal(shape, dtype=np.float32) * np.float32(scale) + np.float32(offset))

    return {
        name: draw(shape, 0.1, 1.0) if "norm" in name else draw(shape, 0.02, 0.0)
        for name, shape in expected_shapes(cfg).items()
    }


def time_events(stream: Stream, fn, repeats: int) -> float:
    """GPU milliseconds per call of ``fn`` (which issues work on ``stream``), after one warm-up call."""
    fn()
    start, end = Event(), Event()
    start.record(stream)
    for _ in range(repeats):
        fn()
    end.record(stream)
    end.synchronize()
    return Event.elapsed_ms(start, end) / repeats


def copy_bandwidth(stream: Stream, nbytes: int = 4 << 30) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus bytes written."""
    src, dst = DeviceBuffer(nbytes), DeviceBuffer(nbytes)
    try:
        ms = time_events(stream, lambda: call("cuMemcpyDtoDAsync", dst.ptr, src.ptr, nbytes, stream.handle), 5)
    finally:
        src.free()
        dst.free()
    return 2 * nbytes / (ms * 1e-3)


def capture(stream: Stream, launches: list[Launch]) -> object:
    """``launches`` (arguments as packed now) captured into an executable graph."""
    cu = driver.cu
    call("cuStreamBeginCapture", stream.handle, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    for launch in launches:
        launch(stream)
    graph = call("cuStreamEndCapture", stream.handle)
    return call("cuGraphInstantiate", graph, 0)


def graph_ms(stream: Stream, launches: list[Launch], repeats: int = 30) -> float:
    exec_ = capture(stream, launches)
    ms = time_events(stream, lambda: call("cuGraphLaunch", exec_, stream.handle), repeats)
    call("cuGraphExecDestroy", exec_)
    return ms


def breakdown(stream: Stream, launches: list[Launch], full_ms: float) -> dict[str, dict[str, float]]:
    """Cost of each launch group in context: the full step's time minus the step's time without that group.

    Leaving a group out changes the data but not the work of the others, so each difference is that group's
    share, launch gaps included.
    """
    groups = sorted({launch.label for launch in launches})
    out = {}
    for label in groups:
        rest = [launch for launch in launches if launch.label != label]
        out[label] = {"launches": len(launches) - len(rest), "ms_per_token": full_ms - graph_ms(stream, rest)}
    return out


def fp8_layout_sweep(stream: Stream, model: CudaModel, position: int) -> dict[str, float]:
    """Step time (graph replay at ``position``) with each FP8 GEMV kind's (blocks per SM, ring depth) set in turn
    to every pair that fits, the others as built: which layout the e4m3 rows want (the layout changes no bits)."""
    from decoder_service.engines.cuda.driver import multiprocessor_count, shared_memory_per_multiprocessor
    from decoder_service.engines.cuda.forward import (
        GSTREAM_STATIC_SHARED,
        MAX_SHARED_PER_BLOCK,
        SM_RESERVED_SHARED,
        gemv_stream_shared,
        gstream_slot_bytes,
    )

    for name in ("gemv_stream_fp8", "gemv_stream_swiglu_fp8"):
        model.module.kernel(name).set_max_dynamic_shared(MAX_SHARED_PER_BLOCK - GSTREAM_STATIC_SHARED)
    sm_shared, sms = shared_memory_per_multiprocessor(), multiprocessor_count()
    built = dict(model.gemv_fp8_layout)
    out: dict[str, float] = {}
    for (k, swiglu), chosen in built.items():
        for per_sm in (1, 2, 3, 4):
            for stages in (2, 3, 4, 6):
                shared = gemv_stream_shared(k, stages, slot_bytes=gstream_slot_bytes(k, 1))
                if shared + GSTREAM_STATIC_SHARED + SM_RESERVED_SHARED > sm_shared // per_sm:
                    continue
                model.gemv_fp8_layout[(k, swiglu)] = (per_sm * sms, stages)
                launches, _ = model._build(1, tokens_ptr=model.token.ptr, pos=position)
                mark = " (built)" if (per_sm * sms, stages) == chosen else ""
                out[f"K={k}{' swiglu' if swiglu else ''}: {per_sm} a SM, ring {stages}{mark}"] = graph_ms(
                    stream, launches
                )
        model.gemv_fp8_layout[(k, swiglu)] = chosen
    return out


# (ring slots, copies in flight at most, ns a poll sleeps after a miss) of the persistent kernel's sweep: the default,
# tighter and looser caps, no cap, then polls that spin or sleep less or more.
PERSISTENT_CONFIGS = (
    (8, 3, 1000),
    (8, 2, 1000),
    (8, 4, 1000),
    (8, 8, 1000),
    (8, 3, 0),
    (8, 3, 500),
    (8, 3, 2000),
)


def persistent_sweep(stream: Stream, model: CudaModel, position: int) -> dict[str, float]:
    """Step time (graph replay at ``position``) of the persistent decode kernel with each of PERSISTENT_CONFIGS
    (TOOLTRIE_PERSISTENT_STAGES, _IN_FLIGHT and _POLL_NS; none changes a bit), beside the layered launch list's."""
    from decoder_service.engines.cuda.persistent import IN_FLIGHT_ENV, POLL_NS_ENV, STAGES_ENV

    def step_ms() -> float:
        launches, _ = model._build(1, tokens_ptr=model.token.ptr, pos=position)
        return graph_ms(stream, launches)

    out = {"layered launch list": step_ms()}
    names = (STAGES_ENV, IN_FLIGHT_ENV, POLL_NS_ENV)
    before, built = {name: os.environ.get(name) for name in names}, model.persistent
    try:
        for config in PERSISTENT_CONFIGS:
            os.environ.update({name: str(value) for name, value in zip(names, config, strict=True)})
            model.persistent = model.persistent_decode()
            try:
                p = model.persistent
                sleep = f", polls sleep {p.poll_ns} ns" if p.poll_ns else ""
                out[f"persistent, ring of {p.stages}, {p.in_flight} in flight{sleep}"] = step_ms()
            finally:
                model.persistent.free()
    finally:
        model.persistent = built
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return out


def gemv_grid_sweep(stream: Stream, launches: list[Launch], blocks: list[int]) -> dict[str, dict[str, float]]:
    """Step time (graph replay) with one GEMV group's grid set to each of ``blocks``, the others as built.

    The GEMV's result does not depend on its grid (cuda/gemv.cuh), so only the time changes.
    """
    out: dict[str, dict[str, float]] = {}
    for label in sorted({launch.label for launch in launches if launch.label.startswith("gemv:")}):
        group = [launch for launch in launches if launch.label == label]
        built = group[0].grid
        groups = gemv_launch_groups(group[0])
        out[label] = {"built": built[0]}
        for n in blocks:
            for launch in group:
                launch.set_grid((min(n, groups), 1, 1))
            out[label][str(n)] = graph_ms(stream, launches)
        for launch in group:
            launch.set_grid(built)
    return out


def gemv_n_index(launch: Launch) -> tuple[int, bool]:
    """The index of a GEMV launch's N argument, and whether it is a SwiGLU-output kernel, which has no residual
    argument."""
    swiglu = launch.kernel.name in ("gemv_swiglu_bf16", "gemv_stream_swiglu_bf16")
    return (7 if swiglu else 8), swiglu


def gemv_launch_groups(launch: Launch) -> int:
    """Row groups of a GEMV launch: the most blocks its grid may have."""
    n_at, swiglu = gemv_n_index(launch)
    streams = launch.kernel.name.startswith("gemv_stream")  # one warp per row; two arguments on: the ring depth
    return gemv_groups(int(launch.arg(n_at)), 1 if streams else int(launch.arg(n_at + 2)), swiglu)


def prefix_costs(stream: Stream, launches: list[Launch], count: int) -> list[dict[str, float | str]]:
    """Marginal cost of each of the step's first ``count`` launches in context: graph time of launches[:j+1]
    minus that of launches[:j] (programmatic edges included, so a launch's share of the overlap counts once)."""
    out, before = [], 0.0
    for j in range(min(count, len(launches))):
        ms = graph_ms(stream, launches[: j + 1], 100)
        out.append({"launch": launches[j].label, "us": (ms - before) * 1e3})
        before = ms
    return out


def alone_costs(stream: Stream, launches: list[Launch], repeats: int = 100) -> dict[str, float]:
    """Microseconds per launch of each of layer 0's kernels replayed ``repeats`` times back to back in one graph
    (its inputs and weights stay in L2): what a kernel costs when nothing around it is cold."""
    out = {}
    for launch in launches[1:6]:  # embedding, then layer 0: qkv, attention, o, gate_up, down
        out[launch.label] = graph_ms(stream, [launch] * repeats, 20) * 1e3 / repeats
    return out


def chain_study(stream: Stream, model: CudaModel, positions: list[int]) -> dict[str, object]:
    """A forced chain's forward pass (``CudaModel.chain_launches``, graph replays, no head) of 2, 3 and 4 tokens
    against the single token's at each position, and each launch group's share of the 4-token pass."""
    from decoder_service.engines.cuda.forward import CHAIN_TOKENS, CLUSTER_ATTENTION_POSITIONS
    from decoder_service.engines.cuda.step import CTL, CTL_WORDS

    ctl = DeviceBuffer(CTL_WORDS * 4)
    out: dict[str, object] = {}
    for position in positions:
        if position + CHAIN_TOKENS > model.max_context:  # the caches end there: no chain fits
            print(f"chain study at {position}: skipped, past max_context {model.max_context}", flush=True)
            continue
        cluster = position + CHAIN_TOKENS <= CLUSTER_ATTENTION_POSITIONS
        form = "cluster" if cluster else "global"
        single, pos_args = model.step_launches(token_ptr=0, pos_ptr=0, attention=form)
        single[0].set(2, 1000)
        for launch, index in pos_args:
            launch.set(index, position)
        row: dict[str, object] = {"cluster_attention": cluster, "single_ms": graph_ms(stream, single, 20)}
        chain = model.chain_launches(
            ctl.ptr + 4 * CTL["chain"], ctl.ptr + 4 * CTL["chain_pos"], ctl.ptr + 4 * CTL["nchain"], form
        )
        for m in range(2, CHAIN_TOKENS + 1):
            words = np.zeros(CTL_WORDS, dtype=np.int32)
            words[CTL["nchain"]], words[CTL["chain_pos"]] = m, position
            words[CTL["chain"] : CTL["chain"] + m] = 1000 + np.arange(m)
            ctl.upload(words, stream)
            row[f"chain{m}_ms"] = graph_ms(stream, chain, 20)
        full = row[f"chain{CHAIN_TOKENS}_ms"]
        row["chain_breakdown_ms"] = {
            label: full - graph_ms(stream, [launch for launch in chain if launch.label != label], 20)
            for label in sorted({launch.label for launch in chain})
        }
        out[str(position)] = row
        print(f"chain study at {position}: {row}", flush=True)
    ctl.free()
    return out


def first_prefill_ab(stream: Stream, model: CudaModel, prefix: int, sizes: range) -> dict[str, float]:
    """A suffix's prefill on its shape's first call (a length never prefilled at that position), wall time to the
    stream's end: the launch list built whole and then launched, against `CudaModel.prefill`, which launches each
    part as it is built; the two alternated over ``sizes``, medians (docs/cuda-speed-notes.md #145)."""
    rng = np.random.default_rng(4)
    times: dict[str, list[float]] = {"built_whole_ms": [], "part_by_part_ms": []}
    for i, n in enumerate(sizes):
        ids = rng.integers(0, model.config.vocab_size, n).astype(np.int32)
        model.length = prefix + 1  # past the study's own prefill at prefix: every (length, position) is new
        stream.synchronize()
        t0 = time.perf_counter()
        if i % 2 == 0:
            model.tokens.upload(ids, stream)
            for launch in model._build(n, tokens_ptr=model.tokens.ptr, pos=model.length)[0]:
                launch(stream)
        else:
            model.prefill(ids.tolist())
        stream.synchronize()
        times["built_whole_ms" if i % 2 == 0 else "part_by_part_ms"].append((time.perf_counter() - t0) * 1e3)
    model.length = prefix
    return {form: float(np.median(v)) for form, v in times.items()}


def prefill_study(stream: Stream, model: CudaModel, prefix: int, suffix: int) -> dict[str, object]:
    """Where a request suffix's prefill spends its time: building its launch list on the host, the whole call
    (launches and wait; the model keeps a shape's launch list after its first prefill, which launches each layer as
    soon as it is built), the launch list alone on the GPU (captured once, replayed), and each kernel's share of
    that (the graph without the kernel's launches)."""
    tokens = np.random.default_rng(2).integers(0, model.config.vocab_size, suffix).astype(np.int32)
    model.tokens.upload(tokens, stream)
    t0 = time.perf_counter()
    launches, _ = model._build(suffix, tokens_ptr=model.tokens.ptr, pos=prefix)
    build_ms = (time.perf_counter() - t0) * 1e3
    calls = []
    for _ in range(5):
        model.length = prefix
        t0 = time.perf_counter()
        model.prefill(tokens.tolist())
        stream.synchronize()
        calls.append((time.perf_counter() - t0) * 1e3)
    graph = graph_ms(stream, launches, 20)
    shares = {}
    for label in sorted({launch.label for launch in launches}):
        rest = [launch for launch in launches if launch.label != label]
        shares[label] = {"launches": len(launches) - len(rest), "ms": graph - graph_ms(stream, rest, 20)}
    # The same launches with `attention` (a block per head and token) where the model groups a kv head's queries.
    kernel, plain_ms = model.prefill_attention, None
    if kernel != "attention":
        model.prefill_attention = "attention"
        try:
            plain, _ = model._build(suffix, tokens_ptr=model.tokens.ptr, pos=prefix)
            plain_ms = graph_ms(stream, plain, 20)
        finally:
            model.prefill_attention = kernel
    model.length = prefix
    return {
        "first_call_ab": first_prefill_ab(stream, model, prefix, range(suffix - 10, suffix + 10)),
        "prefix": prefix,
        "suffix": suffix,
        "launches": len(launches),
        "host_build_ms": build_ms,
        "call_ms_median": float(np.median(calls)),
        "graph_ms": graph,
        "graph_share_ms": shares,
        "attention_kernel": kernel,
        "graph_ms_with_plain_attention": plain_ms,
    }


GEMM_WARPS_SUFFIXES = (8, 16, 36, 64, 128, 256)


def gemm_warps_sweep(
    stream: Stream, model: CudaModel, prefix: int, rounds: int = 3
) -> dict[str, dict[str, list[float]]]:
    """A request suffix's prefill after ``prefix`` cached positions, for each length in GEMM_WARPS_SUFFIXES: its launch
    list with the tensor-core GEMMs on 8 warps and on 16 (TOOLTRIE_GEMM_WARPS, docs/cuda-speed-notes.md #149), each
    replayed as a graph, the two alternated over ``rounds``. Only the 64-row groups change form, so a length whose
    GEMMs take no 64-row group times the same launches twice (a control)."""
    rng = np.random.default_rng(5)
    saved = model.gemm_warps
    out: dict[str, dict[str, list[float]]] = {}
    try:
        for suffix in GEMM_WARPS_SUFFIXES:
            if suffix > model.max_prefill:
                continue
            model.tokens.upload(rng.integers(0, model.config.vocab_size, suffix).astype(np.int32), stream)
            lists = {}
            for warps in (8, 16):
                model.gemm_warps = warps
                lists[warps] = model._build(suffix, tokens_ptr=model.tokens.ptr, pos=prefix)[0]
            times: dict[str, list[float]] = {"8": [], "16": []}
            for _ in range(rounds):
                for warps, launches in lists.items():
                    times[str(warps)].append(graph_ms(stream, launches, 20))
            out[str(suffix)] = times
    finally:
        model.gemm_warps = saved
        model.length = prefix
    return out


def run_cuda_probe(name: str) -> dict[str, object]:
    """Build bench/<name>.cu with nvcc and run it; its standard output is one JSON object. Holds the reason instead
    when nvcc, the build or the run fails."""
    source = REPO / "bench" / f"{name}.cu"
    nvcc = find_nvcc()
    if nvcc is None:
        return {"skipped": "nvcc not found"}
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / name
        built = subprocess.run(
            [nvcc, "-arch=sm_90", "-O3", "-std=c++17", "-o", str(exe), str(source)], capture_output=True, text=True
        )
        if built.returncode != 0:
            return {"skipped": f"nvcc failed: {built.stderr[-500:]}"}
        try:
            ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return {"skipped": "run took over 300 s"}
        if ran.returncode != 0:
            return {"skipped": f"run failed: {ran.stderr[-500:]}"}
        return json.loads(ran.stdout)


def sync_cost() -> dict[str, object]:
    """Microseconds per dependent launch (plain and programmatic) and per grid-wide barrier on this GPU
    (bench/gpu_sync_cost.cu)."""
    return run_cuda_probe("gpu_sync_cost")


def stream_probe() -> dict[str, object]:
    """The GEMV weight stream's rate across dependent phases when one producer per SM streams without waiting on
    data (bench/gpu_stream_probe.cu)."""
    return run_cuda_probe("gpu_stream_probe")


def handover_probe() -> dict[str, object]:
    """What one hand-over between blocks (an L2 round trip, a flag with and without fences, 2 KB through L2 or a
    cluster's shared memory, a grid barrier) costs while a weight stream of 1 to 12 16 KB copies an SM runs beside
    it (bench/gpu_handover_probe.cu)."""
    return run_cuda_probe("gpu_handover_probe")


def handover_probe_lines(probe: dict[str, object]) -> list[str]:
    """The hand-over probe's table for results/gpu.md (ns per hand-over, one column per stream depth); why it did
    not run, if it ran and failed; nothing if it was not asked for."""
    if "skipped" in probe:
        return ["", f"Hand-over probe (`bench/gpu_handover_probe.cu`): not run here ({probe['skipped']})."]
    runs = probe.get("runs")
    if not runs:
        return []
    slots = sorted({r["slots"] for r in runs if r["stream"] != "none"})
    rows: dict[tuple[str, int, str], dict[int, dict[str, float]]] = {}
    for r in runs:
        if r["stream"] == "none":
            for where in ("others", "all"):
                rows.setdefault((r["test"], r["cluster"], where), {})[0] = r
        else:
            rows.setdefault((r["test"], r["cluster"], r["stream"]), {})[r["slots"]] = r
    rates = {r["slots"]: r["stream_TBps"] for r in runs if r["test"] == "chase" and r["stream"] == "others"}
    lines = [
        "",
        f"What one hand-over costs beside a weight stream (`bench/gpu_handover_probe.cu`, {probe['sms']} SMs, one "
        "block an SM; docs/cuda-speed-notes.md #102). Lane 0 of a second warp in each block streams 16 KB pieces "
        "of a 1 GiB buffer with the copy unit, each re-issued as it lands, with the given number of copies in flight "
        "an SM, on the SMs that take no part in the test (others) or on every SM (all). ns per hand-over: chase, one "
        "L2 round trip (a pointer chase through 512 L2-resident lines); flag, a counter passed between two blocks with "
        "a gpu-scope release store and acquire polls (near: in one cluster; far: half the grid apart), relaxed: "
        "without the fences; data, 2 KB written before the release and read back after the acquire; dsmem, the same "
        "2 KB through the partner's shared memory in a cluster of 2; grid barrier: the persistent decode kernel's "
        "before its tagged form (one counter), "
        "then one dependent L2 load; two-level: counted in the cluster first (clusters of 2 or 8). Every value read "
        f"back as written: {'yes' if probe.get('all_values_as_expected') else 'no'}. The stream's rate with 1 to 12 "
        "copies an SM on the other SMs: " + ", ".join(f"{k}: {v:.2f} TB/s" for k, v in sorted(rates.items())) + ".",
        "",
        "| test | cluster | stream on | idle | " + " | ".join(f"{k} in flight" for k in slots) + " |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in slots) + " |",
    ]
    for (test, cluster, where), by_slots in rows.items():
        if len(by_slots) == 1:  # a barrier test's idle row has no stream on the other SMs only
            continue
        cells = " | ".join(f"{by_slots[k]['ns_per_handover']:.0f}" if k in by_slots else "-" for k in [0, *slots])
        lines.append(f"| {test} | {cluster} | {where} | {cells} |")
    return lines


def gemm_warps_lines(b: dict[str, object]) -> list[str]:
    """The report's table of `gemm_warps_sweep`: each suffix's rounds on 8 and on 16 warps. Runs that predate the
    ``gemm_warps`` key ran with 8, then the default."""
    warps = b.get("gemm_warps_prefill_ms")
    if not warps:
        return []
    lines = [
        "",
        f"A request suffix's prefill after a {b['prompt_tokens']}-token prefix, its tensor-core GEMMs' 64-row "
        f"groups on 8 warps and on 16 (`TOOLTRIE_GEMM_WARPS`; the engine's setting in this run: "
        f"{b.get('gemm_warps', 8)}): graph replays of its launch list, the two alternated, ms in each round:",
        "",
        "| suffix tokens | 8 warps | 16 warps | 16 against 8, means (µs) |",
        "| --- | --- | --- | --- |",
    ]
    for suffix, times in warps.items():
        eight, sixteen = times["8"], times["16"]
        lines.append(
            f"| {suffix} | {' / '.join(f'{t:.3f}' for t in eight)} | {' / '.join(f'{t:.3f}' for t in sixteen)} "
            f"| {(np.mean(sixteen) - np.mean(eight)) * 1e3:+.1f} |"
        )
    return lines


def stream_probe_lines(probe: dict[str, object]) -> list[str]:
    """The stream probe's table for results/gpu.md; why it did not run, if it ran and failed; nothing if it was not
    asked for."""
    if "skipped" in probe:
        return ["", f"Weight stream probe (`bench/gpu_stream_probe.cu`): not run here ({probe['skipped']})."]
    runs = probe.get("runs")
    if not runs:
        return []
    lines = [
        "",
        f"Weight stream across dependent phases (`bench/gpu_stream_probe.cu`: {probe['layers']} layers of Qwen3-1.7B's "
        f"four GEMVs, {probe['blocks']} blocks, one producer thread a block streaming 16 KB slots with the copy unit "
        "and never waiting on data, consumer warps reducing them; no attention or norms). Floor: "
        f"{probe['floor_us_per_layer']:.2f} µs per layer at the device-to-device copy rate, "
        f"{probe['copy_TBps']:.2f} TB/s. Modes: barrier (a grid-wide barrier between phases), gap (barrier, plus 5 µs "
        "a layer after qkv, attention's place), free (no barrier), arithmetic (free, the input staged once), copy "
        "(slots released unread), compute (the consumers alone, no copies), barrier-staged-once (barrier, the input "
        "staged once), tagged (no barrier: each output a 64-bit word, the value below the phase's tag, stored and "
        "polled with relaxed accesses, no fence or counter), tagged-gap (tagged, plus the 5 µs); weights unpacked "
        "from bf16 by a shift and a mask (as the engine's GEMVs) or by conversion "
        "instructions (cvt). In flight: the copies the producer lets be outstanding (below the ring's slots, the "
        "rest of the ring holds landed slots ahead of the consumers); paused: the producer issues nothing from its "
        "block's arrival at a grid barrier to the release (tagged: from the end of its phase to its next input "
        "staged). Split: a block's µs per layer, averaged over "
        "the blocks: the consumers' grid wait (with gap mode's gap), staging and tiles (reducing, and waiting for "
        "slots to land); the producer's waits for a free slot and, under a cap, for a landing (with the pauses). "
        "Barriers: µs each, from the global timer, averaged over the launch's barriers: the spread of the blocks' "
        "arrivals, the last arrival to the first release, and a block's mean wait. Products checked "
        f"against the host: {'yes' if probe.get('checked') else 'no'}, worst relative error "
        f"{probe.get('worst_relative_error', float('nan')):.2g}.",
        "",
        "| mode | unpacked by | ring slots | consumer warps | in flight | µs per layer | weight TB/s "
        "| split: grid wait / staging / tiles / ring full / in-flight cap | barriers: arrival spread / last arrival "
        "to release / mean wait |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        unpack = "cvt" if run.get("unpack_with_cvt") else "shift"
        split = run.get("split_us_per_layer")
        split_cell = (
            " / ".join(f"{split[k]:.1f}" for k in ("grid_wait", "staging", "tiles", "ring_full", "in_flight_cap"))
            if split
            else "-"
        )
        barrier = run.get("barrier_us")
        barrier_cell = (
            " / ".join(f"{barrier[k]:.2f}" for k in ("arrival_spread", "last_arrival_to_first_release", "mean_wait"))
            if barrier
            else "-"
        )
        in_flight = f"{run.get('in_flight', run['stages'])}{', paused' if run.get('pause_at_barriers') else ''}"
        lines.append(
            f"| {run['mode']} | {unpack} | {run['stages']} | {run['consumer_warps']} | {in_flight} | "
            f"{run['us_per_layer']:.2f} | {run['weight_TBps']:.2f} | "
            f"{split_cell} | {barrier_cell} |"
        )
    return lines


def write_report(run_dir: Path, results_dir: Path) -> None:
    """Fold one gpu_run.sh output folder into results/gpu.json and results/gpu.md."""
    env_lines, keyed = run_env(run_dir)
    sha = keyed.get("cuda_sources_sha256", "?")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    bench = json.loads((run_dir / "bench_gpu_forward.json").read_text())
    combined = {
        "commit": git_commit(),
        "date": env_lines[0],
        "device": env_lines[1],
        "cuda_sources_sha256": sha,
        "cubin_sha256": keyed.get("cubin_sha256"),
        "env": env_lines,
        "metrics": metrics,
        "bench": bench,
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "gpu.json").write_text(json.dumps(combined, indent=2) + "\n")
    kernels = [m for m in metrics if m["kind"] == "kernel"]
    models = [m for m in metrics if m["kind"] == "model"]
    lines = [
        "# CUDA engine on the GPU: accuracy and first decode timing",
        "",
        f"- date: {env_lines[0]}",
        f"- commit: {git_commit()}",
        f"- device: {env_lines[1]} (name, driver, memory, max SM clock)",
        f"- toolchain: {env_lines[2]}; {env_lines[4]}",
        *code_identity_lines(keyed),
        "- command: `OUT=<dir> scripts/gpu_run.sh` from the repository root, then "
        f"`python3 bench/gpu_forward.py --report <dir> --results {results_dir}`",
        "",
        "## Kernels against float64 numpy references (fresh random inputs, outputs NaN-poisoned; bound 1e-2)",
        "",
        "| kernel case | relative error / exact |",
        "| --- | --- |",
    ]
    for m in kernels:
        value = f"{m['rel_err']:.2e}" if "rel_err" in m else ("exact" if m.get("exact") else "MISMATCH")
        lines.append(f"| {m['name']} | {value} |")
    lines += [
        "",
        "## Whole models against Hugging Face transformers (torch fp32 on the same bf16-rounded weights)",
        "",
        "Random weights (seed 1234), random prompt, greedy decode on the engine, then one teacher-forced torch pass.",
        "",
        "| model | prompt | steps | logits rel. error | worst step | token mismatches (margin > 0.05) "
        "| near-tie disagreements | steps with margin <= 0.05 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in models:
        lines.append(
            f"| {m['name']} | {m['prompt_len']} | {m['steps']} | {m['rel_err']:.2e} | {m['max_step_rel_err']:.2e} "
            f"| {m['token_mismatches']} | {m['near_tie_disagreements']} | {m['steps_with_margin_le_0.05']} |"
        )
    b = bench
    lines += [
        "",
        f"## Decode timing, batch 1, {b['model']}, {b['prompt_tokens']}-token prompt"
        + (f", KV capacity {b['max_context']:,} positions" if "max_context" in b else ""),
        "",
        "| what | value |",
        "| --- | --- |",
        f"| host loop (Python launches, argmax read back), per token | {b['host_loop_ms_per_token']:.3f} ms |",
        f"| same launch list captured in a CUDA graph (kernel time + graph gaps) | "
        f"{b['graph_replay_ms_per_token']:.3f} ms |",
        f"| launches per token | {b['decode_launches_per_token']} |",
        f"| floor: weights + bf16 KV / copy bandwidth | {b['floor_ms']:.3f} ms |",
        f"| floor without the dense head | {b['floor_ms_without_head']:.3f} ms |",
        f"| device-to-device copy bandwidth (read + write) | {b['copy_bandwidth_TBps']:.2f} TB/s |",
        f"| dense head GEMV alone (151,936 x 2048 bf16) | {b['dense_head_gemv_ms']:.3f} ms "
        f"({b['dense_head_bandwidth_TBps']:.2f} TB/s) |",
        f"| prefill of the prompt (tensor-core GEMMs) | {b['prefill_ms']:.1f} ms |",
        "",
        "Per-token cost of each launch group inside the graph (full step minus the step without that group):",
        "",
        "| group | launches | ms per token |",
        "| --- | --- | --- |",
    ]
    for label, part in sorted(b["graph_step_breakdown"].items(), key=lambda kv: -kv[1]["ms_per_token"]):
        lines.append(f"| {label} | {part['launches']} | {part['ms_per_token']:.3f} |")
    sweep = b.get("gemv_grid_sweep_ms_per_token")
    if sweep:
        sizes = [key for key in next(iter(sweep.values())) if key != "built"]
        lines += [
            "",
            "Whole-step time with one GEMV group's grid changed (blocks; the result does not depend on the grid):",
            "",
            "| group | as built | " + " | ".join(f"{n} blocks" for n in sizes) + " |",
            "| --- | --- | " + " | ".join("---" for _ in sizes) + " |",
        ]
        for label, row in sweep.items():
            cells = " | ".join(f"{row[n]:.3f} ms" for n in sizes)
            lines.append(f"| {label} | {row['built']} | {cells} |")
    prefix = b.get("prefix_marginal_us")
    if prefix:
        lines += [
            "",
            "Marginal cost of each of the step's first launches in context (graph of launches[:j+1] minus graph of",
            "launches[:j], with programmatic launch), and of layer 0's kernels each replayed 100 times back to back",
            "(weights and inputs warm in L2):",
            "",
            "| launch | layer 0 (µs) | layer 1 (µs) | layer 2 (µs) | alone, warm (µs) |",
            "| --- | --- | --- | --- | --- |",
        ]
        alone = b.get("alone_us_per_launch", {})
        for j in range(1, 6):
            label = prefix[j]["launch"]
            cells = " | ".join(
                f"{prefix[j + 5 * layer]['us']:.2f}" for layer in range(3) if j + 5 * layer < len(prefix)
            )
            lines.append(f"| {label} | {cells} | {alone.get(label, float('nan')):.2f} |")
    sync = b.get("sync_cost_us")
    if sync and "us_per_pdl_launch" in sync:
        lines += [
            "",
            f"Synchronisation between dependent phases ({sync['phases']} phases of {sync['blocks']} blocks of "
            f"{sync['threads']} threads, `bench/gpu_sync_cost.cu`): {sync['us_per_launch']:.2f} µs per plain "
            f"launch, {sync['us_per_pdl_launch']:.2f} µs per programmatic launch, {sync['us_per_grid_barrier']:.2f} "
            "µs per grid-wide barrier inside one persistent kernel.",
        ]
    lines += stream_probe_lines(b.get("stream_probe", {}))
    lines += handover_probe_lines(b.get("handover_probe", {}))
    pre = b.get("suffix_prefill")
    if pre:
        ab = pre.get("first_call_ab")
        first = (
            f"; a shape's first call, which launches each layer as it is built, {ab['part_by_part_ms']:.1f} ms, "
            f"against {ab['built_whole_ms']:.1f} with its list built whole, then launched (medians of 10 calls each, "
            f"suffixes of {pre['suffix'] - 10} to {pre['suffix'] + 9} tokens)"
            if ab
            else ""
        )
        shares = ", ".join(
            f"{label} {part['ms']:.2f} ms ({part['launches']})"
            for label, part in sorted(pre["graph_share_ms"].items(), key=lambda kv: -kv[1]["ms"])
        )
        lines += [
            "",
            f"Prefill of a {pre['suffix']}-token request suffix after a {pre['prefix']}-token prefix: the call takes "
            f"{pre['call_ms_median']:.1f} ms (median of 5 calls of one shape; building its {pre['launches']} "
            f"launches on the host takes {pre['host_build_ms']:.1f} ms, which a model that keeps the shape's launch "
            f"list skips after the first{first}), the same launches replayed as a graph {pre['graph_ms']:.1f} ms. Each "
            f"kernel's share of the graph (launches): {shares}.",
        ]
        if pre.get("graph_ms_with_plain_attention") is not None:
            lines[-1] += (
                f" Its attention is {pre['attention_kernel']} (a block per kv head and group of tokens); with "
                f"`attention` (a block per head and token) the graph takes "
                f"{pre['graph_ms_with_plain_attention']:.1f} ms."
            )
    lines += gemm_warps_lines(b)
    for position, row in (b.get("forced_chain") or {}).items():
        shares = ", ".join(
            f"{label} {ms:.3f}" for label, ms in sorted(row["chain_breakdown_ms"].items(), key=lambda kv: -kv[1])
        )
        lines += [
            "",
            f"A forced chain's forward pass at position {position} (graph replays, no head; "
            f"{'cluster' if row['cluster_attention'] else 'global'} attention merge): 2 tokens "
            f"{row['chain2_ms']:.3f} ms, 3 tokens {row['chain3_ms']:.3f} ms, 4 tokens {row['chain4_ms']:.3f} ms, "
            f"against {row['single_ms']:.3f} ms for one token. Each group's share of the 4-token pass (ms): {shares}.",
        ]
    lines += [
        "",
        "Notes:",
        "- Activations and attention's arithmetic are fp32; weights and the KV cache are bf16 (fp32 accumulation).",
        "  The floor counts the bytes one step must read.",
        "- Differences of about 0.01 ms in the breakdown are timing noise (a tiny kernel can show a negative cost).",
        "- Decode attention is one launch per layer (attention_decode): rotary embedding and the cache write of the",
        "  new token, fixed 32-position chunks split over up to 24 blocks per head, and the merge in ascending order",
        "  by the head's last block.",
        "- Kernels are launched with programmatic dependent launch: each may start while the one before it still",
        "  runs, and waits for it before touching activations (the GEMVs load their first weights before waiting).",
    ]
    (results_dir / "gpu.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/bench_gpu_forward.json"))
    parser.add_argument("--report", type=Path, help="fold a gpu_run.sh output folder into --results and exit")
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--cubin", type=Path, default=os.environ.get("TOOLTRIE_CUBIN"))
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--max-context",
        type=int,
        default=1024,
        help="the model's KV capacity, which sets the decode attention's grid (bench/gpu_decode.py's engines: 1024)",
    )
    parser.add_argument(
        "--sweeps",
        default="breakdown,grid,prefix,alone,sync,stream,handover,prefill,gemmwarps,chain",
        help="comma-separated studies: breakdown, grid, prefix, alone, sync, stream, handover, prefill, gemmwarps, "
        "chain "
        "(default: all), fp8layout (with --weights fp8), persistent (the persistent kernel's ring, cap and poll sleep)",
    )
    parser.add_argument(
        "--attention",
        choices=["global", "short"],
        default="global",
        help="the replayed step's decode attention: global (attention_decode, any context), or short "
        "(attention_decode_short, the engine's choice for requests within 1,024 positions)",
    )
    parser.add_argument(
        "--weights",
        choices=["bf16", "fp8"],
        default="bf16",
        help="fp8: the projections rounded to e4m3 rows and read so (decoder_service/models/fp8.py)",
    )
    args = parser.parse_args()
    sweeps = set(args.sweeps.split(",")) - {""}
    if args.attention == "short" and args.prompt >= SHORT_ATTENTION_POSITIONS:
        parser.error(f"--attention short takes positions below {SHORT_ATTENTION_POSITIONS} (--prompt {args.prompt})")
    if args.report:
        write_report(args.report, args.results)
        return 0
    if gpu_missing():
        return 2
    module = Module(args.cubin or build_cubin())
    stream = Stream()
    bandwidth = copy_bandwidth(stream)
    cfg = QWEN3_1_7B
    t0 = time.perf_counter()
    weights = synthetic_weights(cfg, seed=0)
    t1 = time.perf_counter()
    if args.weights == "fp8":
        from decoder_service.models.fp8 import quantize_weights

        weights = quantize_weights(cfg, weights)
    t2 = time.perf_counter()
    max_context = max(args.max_context, args.prompt + args.tokens + 8)
    model = CudaModel(
        cfg, weights, module, max_context=max_context, max_prefill=256, stream=stream, weight_format=args.weights
    )
    del weights
    t3 = time.perf_counter()
    # drawing the weights, rounding them to e4m3 rows (fp8), the model's load (checks, conversions, upload)
    setup_s = {"weights": t1 - t0, "quantize": t2 - t1, "load": t3 - t2}

    prompt = np.random.default_rng(1).integers(0, cfg.vocab_size, args.prompt).tolist()
    t0 = time.perf_counter()
    model.prefill(prompt)
    model.read_token()
    prefill_ms = (time.perf_counter() - t0) * 1e3

    # Host loop: every kernel launched from Python, the argmax read back each step.
    tokens = []
    t0 = time.perf_counter()
    for _ in range(args.tokens):
        model.decode()
        tokens.append(model.read_token())
    host_loop_ms = (time.perf_counter() - t0) * 1e3 / args.tokens

    # Kernel-only: replay one captured step (at the last position) many times.
    model.set_decode_position(args.prompt)
    step = model.decode_launches
    if args.attention != "global":
        step, pos_args = model.decode_step_launches(args.attention)
        for launch, index in pos_args:
            launch.set(index, args.prompt)
    step_ms = graph_ms(stream, step, 50)
    parts = breakdown(stream, step, step_ms) if "breakdown" in sweeps else {}
    sweep = gemv_grid_sweep(stream, step, [66, 132, 264]) if "grid" in sweeps else {}
    prefix = prefix_costs(stream, step, 16) if "prefix" in sweeps else []
    alone = alone_costs(stream, step) if "alone" in sweeps else {}
    sync = sync_cost() if "sync" in sweeps else {}
    probe = stream_probe() if "stream" in sweeps else {}
    handover = handover_probe() if "handover" in sweeps else {}
    prefill_parts = prefill_study(stream, model, args.prompt, 36) if "prefill" in sweeps else {}
    gemm_warps = gemm_warps_sweep(stream, model, args.prompt) if "gemmwarps" in sweeps else {}
    chains = chain_study(stream, model, [args.prompt, args.prompt + 508]) if "chain" in sweeps else {}
    fp8_layouts = fp8_layout_sweep(stream, model, args.prompt) if "fp8layout" in sweeps else {}
    persistent_rings = persistent_sweep(stream, model, args.prompt) if "persistent" in sweeps else {}
    head = next(launch for launch in step if launch.label == "gemv:head")
    head_ms = time_events(stream, lambda: head(stream), 20)

    w_bytes = weight_bytes(cfg, args.weights)
    kv_width = cfg.num_kv_heads * cfg.head_dim
    kv_bytes = cfg.num_layers * 2 * args.prompt * kv_width * KV_ENTRY_BYTES
    head_bytes = cfg.vocab_size * cfg.hidden_size * 2
    result = {
        "device": driver.device_name(),
        "driver_version": driver.call("cuDriverGetVersion"),
        "cuda_sources_sha256": cuda_sources_sha256(),
        "model": f"qwen3-1.7b-shape (random bf16{', rounded to e4m3 rows' if args.weights == 'fp8' else ''})",
        "weight_format": args.weights,
        "prompt_tokens": args.prompt,
        "max_context": max_context,
        "decode_tokens": args.tokens,
        "decode_launches_per_token": len(step),
        "decode_attention": args.attention,
        "setup_s": setup_s,
        "prefill_ms": prefill_ms,
        "host_loop_ms_per_token": host_loop_ms,
        "graph_replay_ms_per_token": step_ms,
        "dense_head_gemv_ms": head_ms,
        "dense_head_bandwidth_TBps": head_bytes / (head_ms * 1e-3) / 1e12,
        "copy_bandwidth_TBps": bandwidth / 1e12,
        "weight_bytes": w_bytes,
        "kv_bytes": kv_bytes,
        "floor_ms": (w_bytes + kv_bytes) / bandwidth * 1e3,
        "floor_ms_without_head": (w_bytes - head_bytes + kv_bytes) / bandwidth * 1e3,
        "graph_step_bandwidth_TBps": (w_bytes + kv_bytes) / (step_ms * 1e-3) / 1e12,
        "graph_step_breakdown": parts,
        "gemv_grid_sweep_ms_per_token": sweep,
        "prefix_marginal_us": prefix,
        "alone_us_per_launch": alone,
        "sync_cost_us": sync,
        "stream_probe": probe,
        "handover_probe": handover,
        "suffix_prefill": prefill_parts,
        "gemm_warps_prefill_ms": gemm_warps,
        "gemm_warps": model.gemm_warps,  # the engine's setting in this run (TOOLTRIE_GEMM_WARPS or the default)
        "forced_chain": chains,
        "fp8_layout_sweep_ms_per_token": fp8_layouts,
        "persistent_ring_sweep_ms_per_token": persistent_rings,
        "tokens_head": tokens[:8],
    }
    model.free()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for key, value in result.items():
        print(f"{key:32s} {value:.4g}" if isinstance(value, float) else f"{key:32s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
