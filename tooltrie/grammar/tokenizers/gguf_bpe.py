"""The byte-level BPE tokenizer embedded in a GGUF file (llama.cpp's `tokenizer.ggml.model == "gpt2"`).

The file holds the tokens (in GPT-2's byte alphabet), the merges, a token type per id (3 = control,
4 = user-defined) and the name of the pre-tokenizer (`tokenizer.ggml.pre`). We rebuild the Hugging Face
tokenizer from them. The pre-tokenizer is chosen the way llama.cpp does: for `smollm` (SmolLM, SmolLM2)
digits are split one by one before GPT-2's byte-level regex, exactly as SmolLM2's own `tokenizer.json`
(`Digits(individual_digits=True)`, then `ByteLevel`).
"""

from __future__ import annotations

from pathlib import Path

import gguf
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HfBackend
from tokenizers.models import BPE

from tooltrie.grammar.errors import TokenizerError
from tooltrie.grammar.tokenizers.hf import HfTokenizer
from tooltrie.grammar.tokenizers.qwen import QWEN2_PATTERN, QWEN35_PATTERN

_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CONTROL, _USER_DEFINED = 3, 4


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _pre_tokenizer(pre: str) -> tuple[pre_tokenizers.PreTokenizer, normalizers.Normalizer | None]:
    if pre in ("default", "gpt2", "gpt-2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), None
    if pre in ("smollm", "starcoder"):
        digits = pre_tokenizers.Digits(individual_digits=True)
        return pre_tokenizers.Sequence([digits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]), None
    if pre in ("qwen2", "deepseek-r1-qwen"):
        return _split_then_bytes(QWEN2_PATTERN), normalizers.NFC()
    if pre == "qwen35":
        return _split_then_bytes(QWEN35_PATTERN), normalizers.NFC()
    if pre in ("llama3", "llama-v3", "llama-bpe"):
        return _split_then_bytes(_LLAMA3_PATTERN), None
    raise TokenizerError(
        f"GGUF pre-tokenizer {pre!r} is not supported; "
        "supported: default, gpt2, smollm, starcoder, qwen2, qwen35, llama3"
    )


def _field(reader: gguf.GGUFReader, key: str, path: Path):
    field = reader.fields.get(key)
    if field is None:
        raise TokenizerError(f"{path} has no {key!r}; it does not embed a byte-level BPE tokenizer")
    return field.contents()


def load_gguf_tokenizer(path: str | Path) -> HfTokenizer:
    """Build the tokenizer a GGUF file embeds; the embedding rows come from `<arch>.vocab_size` or the tokens."""
    path = Path(path)
    if not path.is_file():
        raise TokenizerError(f"no GGUF file at {path}")
    reader = gguf.GGUFReader(path)
    model = _field(reader, "tokenizer.ggml.model", path)
    if model != "gpt2":
        raise TokenizerError(f"{path}: tokenizer.ggml.model is {model!r}; only byte-level BPE ('gpt2') is supported")
    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens", path)
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", path)]
    types = (
        reader.fields["tokenizer.ggml.token_type"].contents() if "tokenizer.ggml.token_type" in reader.fields else []
    )
    pre = reader.fields["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in reader.fields else "default"
    arch = reader.fields["general.architecture"].contents() if "general.architecture" in reader.fields else ""
    rows_field = reader.fields.get(f"{arch}.vocab_size")
    rows = max(int(rows_field.contents()), len(tokens)) if rows_field is not None else len(tokens)

    backend = HfBackend(BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer, normalizer = _pre_tokenizer(pre)
    if normalizer is not None:
        backend.normalizer = normalizer
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types, strict=False) if k == _CONTROL]
    )
    backend.add_tokens(
        [
            AddedToken(t, normalized=False, special=False)
            for t, k in zip(tokens, types, strict=False)
            if k == _USER_DEFINED
        ]
    )
    eos_field = reader.fields.get("tokenizer.ggml.eos_token_id")
    stop_text = tokens[int(eos_field.contents())] if eos_field is not None else None
    return HfTokenizer(backend, name=f"gguf:{path.name}", embedding_rows=rows, stop_text=stop_text)
