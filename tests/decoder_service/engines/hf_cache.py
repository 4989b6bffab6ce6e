"""The engines' KV semantics on the transformers side, for the parity references."""

from __future__ import annotations

import inspect
from typing import Any


def bf16_kv_cache() -> Any:
    """A transformers cache that rounds keys and values to bf16 (nearest, ties to even) as they are stored; the
    layer attends over what it returns, its own token's row included, as the engine's attention does."""
    import torch
    from transformers import DynamicCache

    class Bf16KVCache(DynamicCache):
        def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
            def rounded(t: Any) -> Any:
                return t.to(torch.bfloat16).to(t.dtype)

            return super().update(rounded(key_states), rounded(value_states), layer_idx, *args, **kwargs)

    return Bf16KVCache()


def cache_argument(model: Any) -> str:
    """The keyword that gives ``model``'s forward (and ``generate``) a KV cache: transformers 5.2x names it ``cache``
    (``past_key_values`` deprecated, to be removed), earlier releases ``past_key_values``. Read off the class, so a
    compiled forward's wrapper does not hide it."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def with_bf16_kv_cache(model: Any) -> dict[str, Any]:
    """The keyword arguments that give ``model``'s forward a bf16_kv_cache."""
    return {cache_argument(model): bf16_kv_cache(), "use_cache": True}
