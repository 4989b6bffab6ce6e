"""The catalog prompt: a chat-template rendering whose prefix depends only on the catalog version.

The system message lists the tools (``name: description`` while the prefix fits the token budget, names only
past it; past that the catalog is refused). The user message holds the intent and asks for k names, so the
prefix (everything before the intent) is shared by every request of a version and its KV computed once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from decoder_service.engines.catalog import PreparedCatalog, Tool
from tooltrie.grammar.compiler import TokenizationCache, compile_catalog
from tooltrie.grammar.tokenizers import Tokenizer
from tooltrie.grammar.trie import CompiledTrie

# Marks where the user message goes; split out of the rendering, never tokenized.
_SLOT = "\x00tooltrie-intent\x00"
USER_TEMPLATE = "{intent}\n\nName exactly {k} of the listed tools, the most relevant first."
PROMPT_LAYOUT_VERSION = "1"


class PromptBudgetError(ValueError):
    """The catalog's prompt exceeds the token budget even with names only (maps to FAILED_PRECONDITION)."""


def render_chat(template: str, system: str, user: str) -> str:
    """Render a Hugging Face chat template (Jinja2, as transformers configures it) for one exchange."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=True, enable_thinking=False, bos_token="", eos_token=""
    )


def system_message(tools: Sequence[Tool], with_descriptions: bool, sep_text: str) -> str:
    """The tool listing. Each name starts a line, so the model reads it in the tokens it must answer with
    (a name encoded alone); behind a bullet or a space many tokenizers would split it differently."""
    how = "one per line" if sep_text == "\n" else f"separated by {sep_text!r}"
    lines = [f"{t.name}: {t.description}" if with_descriptions and t.description else t.name for t in tools]
    layout = "name: description" if with_descriptions else "name"
    return (
        f"You pick the tools an agent should call for a request. The available tools, one per line as {layout}:\n"
        + "\n".join(lines)
        + f"\n\nAnswer only with tool names from this list, exactly as written, {how}."
    )


def split_prompt(template: str, system: str) -> tuple[str, str]:
    """The rendered text before the user message and after it."""
    rendered = render_chat(template, system, _SLOT)
    if rendered.count(_SLOT) != 1:
        raise ValueError("the chat template does not place the user message exactly once; it cannot serve tooltrie")
    before, after = rendered.split(_SLOT)
    return before, after


def prepare_catalog(
    tools: Sequence[Tool],
    tokenizer: Tokenizer,
    template: str,
    *,
    context_length: int,
    catalog_id: str,
    version: int = 0,
    prompt_budget: int | None = None,
    serving_context: int | None = None,
    sep: int | None = None,
    stop: int | None = None,
    cache: TokenizationCache | None = None,
    trie: CompiledTrie | None = None,
) -> PreparedCatalog:
    """Compile the names and tokenize the prompt prefix of one catalog version.

    ``prompt_budget`` (tokens of the prefix) defaults to a quarter of ``context_length``, the model's trained context,
    and to at most half of ``serving_context``, the positions the engine serves (its KV cache's, on the CUDA engine),
    so that intents and answers fit beside the prefix. ``trie``: the names compiled elsewhere (a registry's push);
    compiled here when None.
    """
    default = context_length // 4 if serving_context is None else min(context_length // 4, serving_context // 2)
    budget = default if prompt_budget is None else prompt_budget
    if trie is None:
        trie = compile_catalog([t.name for t in tools], tokenizer, sep=sep, stop=stop, cache=cache)
    sep_text = tokenizer.decode([trie.sep_token])
    sizes = []
    for with_descriptions in (True, False):
        before, after = split_prompt(template, system_message(tools, with_descriptions, sep_text))
        prefix = tokenizer.encode(before)
        sizes.append(len(prefix))
        if len(prefix) <= budget:
            break
    else:
        raise PromptBudgetError(
            f"the prompt of {len(tools)} tools takes {sizes[1]} tokens with names only "
            f"({sizes[0]} with descriptions), over the prompt budget of {budget} tokens "
            f"(default: a quarter of the model's {context_length}-token context"
            + ("" if serving_context is None else f", at most half of the engine's {serving_context} positions")
            + "); "
            "raise the budget or narrow the catalog"
        )
    key_src = (
        PROMPT_LAYOUT_VERSION,
        catalog_id,
        version,
        tokenizer.fingerprint,
        trie.sep_token,
        trie.stop_token,
        before,
    )
    key = hashlib.sha256("|".join(map(str, key_src)).encode()).hexdigest()[:24]
    return PreparedCatalog(
        version=version,
        cache_key=key,
        trie=trie,
        tokenizer=tokenizer,
        prefix_ids=tuple(prefix),
        tail_text=after,
        user_template=USER_TEMPLATE,
        with_descriptions=with_descriptions,
    )


def intent_problem(catalog: PreparedCatalog, intent: str) -> str | None:
    """Why `intent` cannot go into the prompt, or None: empty, or holding special-token text (it would be
    encoded as the control token itself, e.g. an early end of turn)."""
    if not intent.strip():
        return "the intent is empty; describe what the agent wants to do"
    special = next((s for s in catalog.tokenizer.special_tokens if s in intent), None)
    if special is not None:
        return f"the intent contains the special token text {special!r}; remove it"
    return None


def request_suffix_ids(catalog: PreparedCatalog, intent: str, k: int) -> list[int]:
    """Token ids after the cached prefix: the user message (intent and the ask for k names) and the template tail."""
    if problem := intent_problem(catalog, intent):
        raise ValueError(problem)
    tokenizer = catalog.tokenizer
    return tokenizer.encode(catalog.user_template.format(intent=intent, k=k) + catalog.tail_text)
