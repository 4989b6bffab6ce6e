"""XGrammar as the reference matcher for `root ::= "name1" | "name2" | ...` over one of our vocabularies.

Control tokens: special/added tokens are never name text, so XGrammar gets them as empty strings (its own
marker for special tokens), and our STOP is its only stop token, legal where its grammar may end.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tooltrie.grammar import Tokenizer


def xgrammar_vocab(tok: Tokenizer) -> list[bytes]:
    """Our vocabulary bytes with the special/added tokens emptied (the control-token mapping above)."""
    vocab = list(tok.token_bytes())
    for i in tok.special_tokens.values():
        vocab[i] = b""
    return vocab


@dataclass
class Reference:
    """An XGrammar matcher for `root ::= "n1" | "n2" | ...` over `tok`'s vocabulary."""

    names: Sequence[str]
    tok: Tokenizer
    stop: int
    threads: int = 2
    compile_seconds: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        import xgrammar as xgr

        info = xgr.TokenizerInfo(
            xgrammar_vocab(self.tok), xgr.VocabType.RAW, vocab_size=self.tok.vocab_size, stop_token_ids=[self.stop]
        )
        ebnf = "root ::= " + " | ".join(json.dumps(n, ensure_ascii=False) for n in self.names)
        t0 = time.perf_counter()
        compiled = xgr.GrammarCompiler(info, max_threads=self.threads, cache_enabled=False).compile_grammar(ebnf)
        self.compile_seconds = time.perf_counter() - t0
        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, self.tok.vocab_size)

    def mask(self) -> np.ndarray:
        self.matcher.fill_next_token_bitmask(self.bitmask)
        bits = np.unpackbits(self.bitmask.numpy().view(np.uint8), bitorder="little")
        return np.flatnonzero(bits[: self.tok.vocab_size]).astype(np.int32)
