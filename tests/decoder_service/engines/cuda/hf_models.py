"""Random Hugging Face models (fixed seed) as the whole-model reference: the engine receives the weights rounded
to bf16, and the torch model runs in fp32 on exactly those rounded values, its keys and values rounded to bf16 as
they enter its cache, as the engine's KV cache holds them (cuda/kv_cache.cuh)."""

from __future__ import annotations

from typing import Any

import numpy as np

from decoder_service.models.config import ModelConfig
from tests.decoder_service.engines.cuda.reference import rel_err
from tests.decoder_service.engines.hf_cache import with_bf16_kv_cache

NEAR_TIE = 0.05  # top-2 logit margin under which a different greedy token is a tie, not an error

SHAPES: dict[str, ModelConfig] = {
    "tiny-qwen3": ModelConfig("qwen3", 1000, 256, 512, 2, 4, 2, 64, 1e-6, 1e6, 512, True),
    "tiny-qwen2-hd128-untied": ModelConfig("qwen2", 1000, 512, 768, 2, 4, 2, 128, 1e-6, 1e6, 512, False),
    "tiny-llama-untied": ModelConfig("llama", 1000, 192, 384, 2, 3, 1, 64, 1e-5, 1e4, 512, False),
    "smollm2-shape": ModelConfig("llama", 49152, 576, 1536, 30, 9, 3, 64, 1e-5, 1e5, 8192, True),
    "qwen3-1.7b-shape": ModelConfig("qwen3", 151936, 2048, 6144, 28, 16, 8, 128, 1e-6, 1e6, 40960, True),
}


def hf_config(cfg: ModelConfig) -> Any:
    import transformers

    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[
        cfg.architecture
    ]
    hf = cls(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        attn_implementation="eager",
    )
    params = getattr(hf, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(hf, "rope_theta", None))
    if theta != cfg.rope_theta:
        raise AssertionError(f"transformers config took rope_theta {theta}, expected {cfg.rope_theta}")
    return hf


def build_reference(cfg: ModelConfig, seed: int, device: str = "cpu") -> tuple[Any, dict[str, np.ndarray]]:
    """(fp32 torch model with bf16-rounded parameters, weights dict of bf16 bits as uint16 arrays)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cls = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
    }[cfg.architecture]
    with torch.device(device):
        model = cls(hf_config(cfg)).float().eval()
    weights = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            # HF initialises norms to 1 and biases to 0, which would hide a misplaced norm weight or bias.
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            rounded = p.to(torch.bfloat16)
            p.copy_(rounded.float())
            weights[name] = rounded.view(torch.int16).cpu().numpy().view(np.uint16)
    if cfg.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    return model, weights


def build_fp8_reference(cfg: ModelConfig, seed: int, device: str = "cpu") -> tuple[Any, dict[str, np.ndarray]]:
    """build_reference with the layer projections rounded to e4m3 rows (decoder_service/models/fp8.py), in the
    weights dict (float32) and in the torch model alike."""
    import torch

    from decoder_service.models.fp8 import quantize_weights

    model, weights = build_reference(cfg, seed, device)
    weights = quantize_weights(cfg, weights)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if weights.get(name) is not None and weights[name].dtype == np.float32:
                p.copy_(torch.from_numpy(weights[name]))
    return model, weights


def reference_logits(model: Any, ids: list[int]) -> np.ndarray:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = next(model.parameters()).device
    with torch.no_grad():
        ids_t = torch.tensor([ids], device=device)
        out = model(input_ids=ids_t, **with_bf16_kv_cache(model)).logits[0]
    return out.double().cpu().numpy()


def compare_greedy(cuda_model: Any, hf_model: Any, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    """Greedy on the engine, then one teacher-forced torch pass over prompt + generated tokens.

    Returns the logits' relative error, and per step whether the tokens agree; a disagreement counts as a
    near-tie when the reference's top-2 margin is at most NEAR_TIE, else as a mismatch.
    """
    from decoder_service.engines.cuda.host_loop import greedy_decode

    res = greedy_decode(cuda_model, prompt, new_tokens, keep_logits=True)
    ref = reference_logits(hf_model, prompt + res.tokens[:-1])[len(prompt) - 1 :]
    out = np.stack(res.logits).astype(np.float64)
    mismatches, near_ties, small_margins = 0, 0, 0
    for step, token in enumerate(res.tokens):
        top2 = np.sort(ref[step])[-2:]
        margin = float(top2[1] - top2[0])
        small_margins += margin <= NEAR_TIE
        if token != int(np.argmax(ref[step])):
            if margin > NEAR_TIE:
                mismatches += 1
            else:
                near_ties += 1
    return {
        "rel_err": rel_err(out, ref),
        "max_step_rel_err": max(rel_err(o, r) for o, r in zip(out, ref, strict=True)),
        "prefill_rel_err": rel_err(out[0], ref[0]),
        "steps": len(res.tokens),
        "token_mismatches": mismatches,
        "near_tie_disagreements": near_ties,
        "steps_with_margin_le_0.05": small_margins,
        "tokens": res.tokens,
    }
