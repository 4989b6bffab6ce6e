from __future__ import annotations

from pathlib import Path

import pytest

from decoder_service.engines.catalog import PreparedCatalog, Tool, parse_mcp_tools
from decoder_service.engines.prompt import PromptBudgetError, prepare_catalog, render_chat, request_suffix_ids
from decoder_service.models.tokenizer_source import chat_template, model_tokenizer
from tests.decoder_service.engines.conftest import TOOLS


def _prepare(
    tiny_dir: Path, budget: int | None = None, tools=TOOLS, version: int = 1, serving_context: int | None = None
) -> PreparedCatalog:
    return prepare_catalog(
        tools,
        model_tokenizer(tiny_dir),
        chat_template(tiny_dir),
        context_length=4096,
        catalog_id="c",
        version=version,
        prompt_budget=budget,
        serving_context=serving_context,
    )


def test_prefix_is_shared_and_the_request_part_follows(tiny_dir: Path) -> None:
    catalog = _prepare(tiny_dir)
    tokenizer = catalog.tokenizer
    prefix = tokenizer.decode(catalog.prefix_ids)
    assert "\nslack.search: Search Slack messages.\n" in prefix and catalog.with_descriptions
    suffix = request_suffix_ids(catalog, "find the release notes", 2)
    whole = tokenizer.decode(list(catalog.prefix_ids) + suffix)
    system = prefix.split("<|im_start|>system\n", 1)[1].split("<|im_end|>", 1)[0]
    user = catalog.user_template.format(intent="find the release notes", k=2)
    assert whole == render_chat(chat_template(tiny_dir), system, user)
    assert "find the release notes" not in prefix and "exactly 2" in tokenizer.decode(suffix)


def test_budget_falls_back_to_names_then_refuses(tiny_dir: Path) -> None:
    full = len(_prepare(tiny_dir).prefix_ids)
    names_only = _prepare(tiny_dir, budget=full - 1)
    assert not names_only.with_descriptions and len(names_only.prefix_ids) < full
    assert "Open a new issue" not in names_only.tokenizer.decode(names_only.prefix_ids)
    limit = len(names_only.prefix_ids) - 1
    with pytest.raises(PromptBudgetError, match=f"over the prompt budget of {limit} tokens"):
        _prepare(tiny_dir, budget=limit)


def test_default_budget_is_a_quarter_of_the_context(tiny_dir: Path) -> None:
    full = len(_prepare(tiny_dir).prefix_ids)

    def with_descriptions(context_length: int) -> bool:
        return prepare_catalog(
            TOOLS, model_tokenizer(tiny_dir), chat_template(tiny_dir), context_length=context_length, catalog_id="c"
        ).with_descriptions

    assert with_descriptions(4 * full)
    assert not with_descriptions(4 * full - 4)


def test_default_budget_is_at_most_half_the_engines_context(tiny_dir: Path) -> None:
    """An engine that serves fewer positions than the model was trained for caps the default budget at half of
    them, and says so when even the names do not fit."""
    full = len(_prepare(tiny_dir).prefix_ids)
    assert _prepare(tiny_dir, serving_context=2 * full).with_descriptions
    assert not _prepare(tiny_dir, serving_context=2 * full - 2).with_descriptions
    with pytest.raises(PromptBudgetError, match=r"over the prompt budget of 20 tokens .*half of the engine's 40 pos"):
        _prepare(tiny_dir, serving_context=40)


def test_cache_key_follows_version(tiny_dir: Path) -> None:
    assert _prepare(tiny_dir, version=1).cache_key == _prepare(tiny_dir, version=1).cache_key
    assert _prepare(tiny_dir, version=1).cache_key != _prepare(tiny_dir, version=2).cache_key


def test_parse_mcp_tools() -> None:
    assert parse_mcp_tools({"tools": [{"name": "a", "description": "x", "inputSchema": {}}, {"name": "b"}]}) == [
        Tool("a", "x"),
        Tool("b", ""),
    ]
    with pytest.raises(ValueError, match="tool #1 has no string 'name'"):
        parse_mcp_tools({"tools": [{"name": "a"}, {"title": "b"}]})
    with pytest.raises(ValueError, match="MCP tools/list result"):
        parse_mcp_tools({"tools": []})
    # the registry's naming rule, so that a file decoded locally is one the registry would take
    with pytest.raises(ValueError, match=r"tools\[1\]\.name: 'send mail!' \(10 characters\) is not 1-128 characters"):
        parse_mcp_tools({"tools": [{"name": "a"}, {"name": "send mail!"}]})
