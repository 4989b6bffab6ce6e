from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from decoder_service.models.hf_config import read_hf_config
from decoder_service.models.synth import PRESETS, write_synthetic_checkpoint
from decoder_service.models.synth_cli import synth
from decoder_service.models.tokenizer_source import chat_template, model_tokenizer, tokenizer_spec


def test_seeded_and_deterministic(tmp_path: Path, tiny_dir: Path) -> None:
    again = write_synthetic_checkpoint("tiny", 7, tmp_path / "again")
    other = write_synthetic_checkpoint("tiny", 8, tmp_path / "other")
    same = (tiny_dir / "model.safetensors").read_bytes()
    assert (again / "model.safetensors").read_bytes() == same
    assert (other / "model.safetensors").read_bytes() != same


def test_layout_and_activations_are_sane(tiny_dir: Path, tiny_model) -> None:
    config, weights = tiny_model
    hf = json.loads((tiny_dir / "config.json").read_text())
    assert hf["architectures"] == ["Qwen3ForCausalLM"] and hf["model_type"] == "qwen3"
    assert read_hf_config(tiny_dir) == config == PRESETS["tiny"]
    assert 0.015 < weights["model.layers.0.mlp.up_proj.weight"].std() < 0.025
    assert abs(weights["model.norm.weight"].mean() - 1) < 0.05


def test_tokenizer_and_chat_template(tiny_dir: Path) -> None:
    tokenizer = model_tokenizer(tiny_dir)
    assert tokenizer.vocab_size == PRESETS["tiny"].vocab_size
    assert tokenizer.special_tokens["<|im_end|>"] == 151645
    assert "<|im_start|>" in chat_template(tiny_dir)


def test_cli(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        synth, ["--config", "tiny", "--seed", "1", "--out", str(tmp_path / "m"), "--dtype", "fp16"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "m" / "config.json").read_text())["torch_dtype"] == "float16"


def test_unknown_preset() -> None:
    with pytest.raises(ValueError, match="unknown synthetic config 'huge'; presets: tiny"):
        write_synthetic_checkpoint("huge", 0, Path("unused"))


def test_smollm2_shape_tokenizer_is_the_embedded_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the tokenizer side: writing 135M random weights does not belong in the fast suite.
    from decoder_service.models import synth as synth_module

    monkeypatch.setattr(synth_module, "_write_weights", lambda *args: None)
    out = write_synthetic_checkpoint("smollm2-shape", 0, tmp_path / "s")
    assert tokenizer_spec(out) == "smollm2"
    assert "<|im_start|>assistant" in chat_template(out)
