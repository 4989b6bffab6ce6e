"""Errors of the grammar package. Each message says what was wrong, with which value, and what is accepted."""

from __future__ import annotations


class GrammarError(Exception):
    """Base class of every grammar error (compile, load, runtime)."""


class CompileError(GrammarError, ValueError):
    """A catalog cannot be compiled (empty name, duplicate tokenization, control token inside a name...)."""


class TrieFormatError(GrammarError, ValueError):
    """A serialised trie is corrupt, of an unknown version, or for another tokenizer."""


class KTooLargeError(GrammarError, ValueError):
    """k asks for more distinct pointers than the catalog (or the allowed set) holds; maps to INVALID_ARGUMENT."""


class InvalidStateError(GrammarError, ValueError):
    """A runtime state was built with bad arguments (k out of range, allowed ids outside the catalog)."""


class EmptyMaskError(GrammarError, RuntimeError):
    """No token is legal in the current state; the decoder must stop rather than emit anything."""


class IllegalTokenError(GrammarError, RuntimeError):
    """A token that is not on a live edge of the current node was fed to the runtime."""


class TokenizerError(GrammarError, ValueError):
    """A tokenizer spec or file cannot be loaded."""
