"""Grammar: tokenizers, the token-trie compiler, its serialised form and the host runtime.

from tooltrie.grammar import GrammarState, compile_catalog, load_tokenizer

tok = load_tokenizer("qwen3")
trie = compile_catalog(["get_user", "get_user_by_id", "list_users"], tok)
blob = trie.to_bytes(); trie = CompiledTrie.from_bytes(blob, expected_fingerprint=tok.fingerprint)
state = GrammarState(trie, k=2)
"""

from tooltrie.grammar.compiler import TokenizationCache, compile_catalog
from tooltrie.grammar.errors import (
    CompileError,
    EmptyMaskError,
    GrammarError,
    IllegalTokenError,
    InvalidStateError,
    KTooLargeError,
    TokenizerError,
    TrieFormatError,
)
from tooltrie.grammar.runtime import GrammarState
from tooltrie.grammar.tokenizers import Tokenizer, load_tokenizer
from tooltrie.grammar.trie import CONSTANT_BANK_BYTES, K_MAX, CompiledTrie, TrieStats

__all__ = [
    "CONSTANT_BANK_BYTES",
    "K_MAX",
    "CompileError",
    "CompiledTrie",
    "EmptyMaskError",
    "GrammarError",
    "GrammarState",
    "IllegalTokenError",
    "InvalidStateError",
    "KTooLargeError",
    "TokenizationCache",
    "Tokenizer",
    "TokenizerError",
    "TrieFormatError",
    "TrieStats",
    "compile_catalog",
    "load_tokenizer",
]

# Character-level mode: any tokenization that spells a catalog name is legal (same CompiledTrie form).
from tooltrie.grammar.charlevel import compile_charlevel
from tooltrie.grammar.charlevel_vocab import MatcherCache, VocabularyMatcher

__all__ += ["MatcherCache", "VocabularyMatcher", "compile_charlevel"]
