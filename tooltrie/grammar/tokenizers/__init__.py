"""Tokenizers: one interface (`base.Tokenizer`), one backend per file, and `load_tokenizer(spec)`."""

from tooltrie.grammar.tokenizers.base import Tokenizer
from tooltrie.grammar.tokenizers.spec import SPECS, load_tokenizer

__all__ = ["SPECS", "Tokenizer", "load_tokenizer"]
