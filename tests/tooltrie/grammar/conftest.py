"""Shared fixtures: real tokenizers are loaded once per test session (the Qwen vocabularies take ~0.5 s)."""

from __future__ import annotations

import pytest

from tooltrie.grammar.tokenizers import Tokenizer, load_tokenizer


@pytest.fixture(scope="session")
def qwen3() -> Tokenizer:
    return load_tokenizer("qwen3")


@pytest.fixture(scope="session")
def qwen36() -> Tokenizer:
    return load_tokenizer("qwen3.6")


@pytest.fixture(scope="session")
def smollm2() -> Tokenizer:
    return load_tokenizer("smollm2")
