"""The policy server's prefix cache: the keys and values of sequences it decoded, kept for the
requests that extend them.

A rollout's turn t+1 prompt is turn t's prompt, turn t's completion and the new observation, so
most of its prefill repeats work the server already did. ``PrefixCache`` keeps, per finished
sequence, its token ids (prompt + completion, less the last sampled token, which was never fed
to the model) and its keys and values, one tensor pair per layer. A new prompt takes the entry
that shares its longest common prefix (a re-tokenized tail costs only the tokens after the
first difference) and prefills only the rest.

The bound is ``max_tokens`` cached tokens in all, least recently used first out; an entry that
is a prefix of a newer one is dropped (the newer holds it), and a sequence longer than the bound
is not kept. Memory is ``max_tokens`` x layers x 2 x key-value heads x head size x dtype bytes:
2 KiB a token for the default tiny Llama, 45 KiB for SmolLM2-135M in float32. The entries
belong to one set of weights: the engine clears them when it loads new ones.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KeysValues = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, the keys and the values of one sequence: [1, heads, tokens, head size] each."""


@dataclass
class _Entry:
    ids: torch.Tensor
    kv: KeysValues


def row_keys_values(cache: DynamicCache, row: int, start: int, end: int) -> KeysValues | None:
    """Row ``row``'s keys and values at positions [start, end), copied out of a batch's cache;
    None for a cache that is not plain full attention (a sliding window keeps only a tail)."""
    if not all(type(layer) is DynamicLayer and layer.is_initialized for layer in cache.layers):
        return None
    return [(layer.keys[row:row + 1, :, start:end].clone(),
             layer.values[row:row + 1, :, start:end].clone()) for layer in cache.layers]


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    """Keys and values of finished sequences, bounded by ``max_tokens`` (0 keeps nothing).
    Used from the batcher's thread only, under its lock."""

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be 0 (no cache) or more, not {max_tokens}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next_key = 0
        self.tokens = 0
        """Tokens cached now; never more than ``max_tokens``."""
        self.hits = 0
        self.reused = 0
        """Prompts that found a prefix, and the prompt tokens those prefixes saved."""

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: list[int]) -> tuple[int, KeysValues] | None:
        """The longest cached prefix of ``prompt``, as its length and its keys and values;
        at least the last prompt token is left out, whose logits start the generation."""
        if not self._entries:
            return None
        ids = torch.tensor(prompt)
        best, key = 0, None
        for k, entry in self._entries.items():
            n = common_prefix(entry.ids, ids)
            if n > best:
                best, key = n, k
        best = min(best, len(prompt) - 1)
        if key is None or best < 1:
            return None
        self._entries.move_to_end(key)
        self.hits, self.reused = self.hits + 1, self.reused + best
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in self._entries[key].kv]

    def store(self, ids: list[int], kv: KeysValues) -> None:
        """Keep ``kv``, the keys and values of ``ids``, evicting the least recently used."""
        if not ids or len(ids) > self.max_tokens:
            return
        new = torch.tensor(ids)
        for k, entry in list(self._entries.items()):
            shared = common_prefix(entry.ids, new)
            if shared == len(new):  # already held, by this entry or one that extends it
                self._entries.move_to_end(k)
                return
            if shared == len(entry.ids):  # the new one holds this one
                self._drop(k)
        while self.tokens + len(ids) > self.max_tokens:
            self._drop(next(iter(self._entries)))
        self._entries[self._next_key] = _Entry(new, kv)
        self._next_key += 1
        self.tokens += len(ids)

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0

    def _drop(self, key: int) -> None:
        self.tokens -= len(self._entries.pop(key).ids)
