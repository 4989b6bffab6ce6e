from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from decoder_service.models import synth
from decoder_service.models.hf_loader import load_hf_dir
from decoder_service.models.safetensors_io import read_safetensors


def test_reads_what_torch_writes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ref = {n: rng.standard_normal((3, 5)).astype(np.float32) for n in ("a", "b", "c")}
    save_file(
        {
            "a": torch.from_numpy(ref["a"]).bfloat16(),
            "b": torch.from_numpy(ref["b"]).half(),
            "c": torch.from_numpy(ref["c"]),
        },
        str(tmp_path / "t.safetensors"),
    )
    got = read_safetensors(tmp_path / "t.safetensors")
    assert np.array_equal(got["a"], torch.from_numpy(ref["a"]).bfloat16().float().numpy())
    assert got["b"].dtype == np.float16 and np.array_equal(got["b"], ref["b"].astype(np.float16))
    assert np.array_equal(got["c"], ref["c"])


def test_unsupported_dtype_is_named(tmp_path: Path) -> None:
    save_file({"ids": torch.arange(4)}, str(tmp_path / "t.safetensors"))
    with pytest.raises(ValueError, match="'ids' has dtype I64"):
        read_safetensors(tmp_path / "t.safetensors")


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_synthetic_checkpoint_loads_with_transformers_values(tmp_path: Path, dtype: str) -> None:
    from transformers import AutoModelForCausalLM

    out = synth.write_synthetic_checkpoint("tiny", 3, tmp_path / dtype, dtype=dtype)
    _, ours = load_hf_dir(out)
    theirs = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    for name, value in ours.items():
        assert np.array_equal(value, theirs[name].numpy()), name


def test_sharded_equals_single(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    single = synth.write_synthetic_checkpoint("tiny", 5, tmp_path / "single")
    monkeypatch.setattr(synth, "SHARD_BYTES", 8 * 1024**2)
    sharded = synth.write_synthetic_checkpoint("tiny", 5, tmp_path / "sharded")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not (sharded / "model.safetensors").exists()
    cfg_a, a = load_hf_dir(single)
    cfg_b, b = load_hf_dir(sharded)
    assert cfg_a == cfg_b and a.keys() == b.keys()
    assert all(np.array_equal(a[n], b[n]) for n in a)


def test_missing_shard_and_missing_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(synth, "SHARD_BYTES", 8 * 1024**2)
    out = synth.write_synthetic_checkpoint("tiny", 5, tmp_path / "m")
    shard = sorted(set(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"].values()))[-1]
    (out / shard).unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(shard)):
        load_hf_dir(out)
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(out / "config.json", empty)
    with pytest.raises(FileNotFoundError, match=r"neither model\.safetensors"):
        load_hf_dir(empty)


def test_config_weights_mismatch_is_refused(tmp_path: Path) -> None:
    out = synth.write_synthetic_checkpoint("tiny", 1, tmp_path / "m")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"intermediate_size": 96}))
    message = "mlp.gate_proj.weight' has shape (128, 64) but the config implies (96, 64)"
    with pytest.raises(ValueError, match=re.escape(message)):
        load_hf_dir(out)
