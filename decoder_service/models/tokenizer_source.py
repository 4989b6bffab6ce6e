"""The tokenizer and chat template that belong to a model path (GGUF file or HF directory)."""

from __future__ import annotations

import json
from pathlib import Path

from decoder_service.models.gguf_loader import gguf_chat_template
from decoder_service.models.loader import embedded_model_path, resolve_model_path
from tooltrie.grammar.tokenizers import Tokenizer, load_tokenizer

# A model directory may name a built-in tooltrie tokenizer spec instead of carrying tokenizer.json, so the
# decoder reports the same fingerprint as a registry compiling for that spec.
TOOLTRIE_TOKENIZER_FILE = "tooltrie_tokenizer.json"


def tokenizer_spec(path: str | Path | None) -> str:
    """The ``load_tokenizer`` spec of the model at ``path`` (None: the embedded model)."""
    p = resolve_model_path(path)
    if p.is_file():
        return "smollm2" if p.resolve() == embedded_model_path().resolve() else f"gguf:{p}"
    spec_file = p / TOOLTRIE_TOKENIZER_FILE
    if spec_file.is_file():
        return str(json.loads(spec_file.read_text())["spec"])
    if (p / "tokenizer.json").is_file():
        return f"hf:{p}"
    raise FileNotFoundError(
        f"{p} holds neither {TOOLTRIE_TOKENIZER_FILE} nor tokenizer.json; a model directory needs one of them"
    )


def model_tokenizer(path: str | Path | None) -> Tokenizer:
    return load_tokenizer(tokenizer_spec(path))


def chat_template(path: str | Path | None) -> str:
    """The Jinja2 chat template: the GGUF's ``tokenizer.chat_template`` or ``tokenizer_config.json``'s."""
    p = resolve_model_path(path)
    template = gguf_chat_template(p) if p.is_file() else _dir_template(p)
    if not template:
        raise ValueError(
            f"the model at {p} carries no chat template; add one to its tokenizer_config.json "
            "(key chat_template) or its GGUF (key tokenizer.chat_template)"
        )
    return template


def _dir_template(p: Path) -> str | None:
    config = p / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text()).get("chat_template")
        if template:
            return template
    jinja = p / "chat_template.jinja"
    return jinja.read_text() if jinja.is_file() else None
