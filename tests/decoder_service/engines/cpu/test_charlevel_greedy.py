"""Greedy decoding under a character-level grammar names what greedy decoding under XGrammar's mask names.

Same model, same prompt, same logits (dense head): our CPU engine decides with the character-level trie,
the reference loop with `xgrammar.GrammarMatcher` for `root ::= "name1" | "name2" | ...`; both take the
argmax over their legal tokens with ties to the lower id. k = 1 (XGrammar's grammar holds one name).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from decoder_service.engines.base import DecodeRequest, PointerEvent
from decoder_service.engines.catalog import Tool
from decoder_service.engines.cpu.engine import CpuEngine
from decoder_service.engines.cpu.model import CpuTransformer
from decoder_service.engines.prompt import prepare_catalog, request_suffix_ids
from decoder_service.models.tokenizer_source import chat_template, model_tokenizer
from tests.support.xgrammar_reference import Reference
from tooltrie.grammar import compile_charlevel

pytest.importorskip("xgrammar")

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "catalogs" / "workplace.json"
INTENTS = [
    "Open a bug report about the login crash",
    "Tell the team in chat that the deploy is done",
    "Book a meeting with Ana on Friday at 10",
    "Share the budget spreadsheet with finance",
    "What is the weather in Lisbon tomorrow?",
    "Translate the welcome email into German",
]


def xgrammar_greedy(model: CpuTransformer, prompt: list[int], ref: Reference, stop: int) -> list[int]:
    cache = model.new_cache(len(prompt) + 128)
    hidden = model.prefill(prompt, cache)
    ref.matcher.reset()
    tokens: list[int] = []
    while True:
        legal = ref.mask()
        token = int(legal[np.argmax(model.logits(hidden)[legal])])  # first maximum: the lower id
        assert ref.matcher.accept_token(token)
        if token == stop:
            return tokens
        tokens.append(token)
        hidden = model.decode(token, cache)


def test_greedy_pointer_equals_xgrammar_greedy(tiny_dir: Path, tiny_model) -> None:
    tools = [Tool(t["name"], t["description"]) for t in json.loads(EXAMPLE.read_text())["tools"]]
    tokenizer = model_tokenizer(tiny_dir)
    trie = compile_charlevel([t.name for t in tools], tokenizer)
    catalog = prepare_catalog(
        tools, tokenizer, chat_template(tiny_dir), context_length=8192, catalog_id="charlevel-greedy", trie=trie
    )
    model = CpuTransformer(*tiny_model)
    engine = CpuEngine(model, head="dense")
    ref = Reference([t.name for t in tools], tokenizer, stop=trie.stop_token)
    for intent in INTENTS:
        ours = [
            e for e in engine.decode(DecodeRequest(intent=intent, k=1, catalog=catalog)) if isinstance(e, PointerEvent)
        ]
        prompt = list(catalog.prefix_ids) + request_suffix_ids(catalog, intent, 1)
        theirs = xgrammar_greedy(model, prompt, ref, trie.stop_token)
        assert len(theirs) >= 2 and list(ours[0].token_ids) == theirs, intent
        assert ours[0].name == tokenizer.decode(theirs)
