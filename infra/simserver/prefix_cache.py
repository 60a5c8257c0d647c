"""Block-based LRU prefix cache shared by all sequences (like vLLM's automatic prefix
caching, much simplified; the exact rule is in docs/simserver.md).

A token sequence is cut into blocks of `block_size` tokens; only full blocks are cached.
Block keys form a hash chain, `key = hash((previous key, the block's tokens))`, so a key
names the whole prefix up to the end of its block. At admission a sequence's hit is the
longest run of cached keys from the start, limited to blocks that end before the prompt's
last token (the engine always computes that one). When a sequence finishes or is aborted
after admission, the keys of its prompt + generated tokens are inserted (or refreshed);
beyond `capacity_tokens // block_size` blocks the least recently used are evicted, and
within one sequence the later blocks count as older (its tail goes before its head).

The cache is an LRU of its own, sized like the KV budget by default; it does not take KV
reservations away from running sequences.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from analysis.kernel.errors import UsageError

ROOT = 0  # the "previous key" of a sequence's first block


@dataclass(frozen=True)
class PrefixCacheConfig:
    """`--prefix-cache`, `--block-size`, `--prefix-cache-tokens` (None: the KV budget)."""

    enabled: bool = True
    block_size: int = 16
    capacity_tokens: int | None = None

    def check(self) -> None:
        if self.block_size < 1:
            raise UsageError(f"--block-size must be >= 1 token, not {self.block_size}")
        if self.capacity_tokens is not None and self.capacity_tokens < 0:
            raise UsageError(f"--prefix-cache-tokens must be >= 0, not {self.capacity_tokens}")


def block_keys(tokens: Sequence[Hashable], block_size: int, previous: int = ROOT) -> list[int]:
    """The hash-chain keys of the full blocks of `tokens`, continuing from `previous`."""
    keys: list[int] = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        previous = hash((previous, tuple(tokens[start : start + block_size])))
        keys.append(previous)
    return keys


class PrefixCache:
    """An LRU set of block keys. Hits and queries are counted in tokens (as vLLM does)."""

    def __init__(self, block_size: int, capacity_tokens: int) -> None:
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0  # prompt tokens of admitted sequences
        self.hits = 0  # of which were found in the cache
        self.evicted_blocks = 0
        self.resets = 0  # POST /reset_prefix_cache or /flush_cache (api.py)

    @property
    def cached_blocks(self) -> int:
        return len(self._blocks)

    @property
    def capacity_tokens(self) -> int:
        return self.capacity_blocks * self.block_size

    def match(self, keys: Sequence[int], prompt_tokens: int) -> int:
        """Tokens of the prompt found in the cache (block-aligned, < prompt_tokens);
        looks only, changes nothing."""
        limit = min(len(keys), max(prompt_tokens - 1, 0) // self.block_size)
        blocks = self._blocks
        hit = 0
        while hit < limit and keys[hit] in blocks:
            hit += 1
        return hit * self.block_size

    def admit(self, keys: Sequence[int], prompt_tokens: int, cached_tokens: int) -> None:
        """Count one admitted sequence and mark its hit blocks as just used."""
        self.queries += prompt_tokens
        self.hits += cached_tokens
        blocks = self._blocks
        for key in reversed(keys[: cached_tokens // self.block_size]):
            blocks.move_to_end(key)

    def reset(self) -> None:
        """Empty the cache (vLLM's /reset_prefix_cache, SGLang's /flush_cache). Sequences
        still running insert their blocks when they end, as usual."""
        self._blocks.clear()
        self.resets += 1

    def insert(self, keys: Sequence[int]) -> None:
        """Add (or refresh) a sequence's blocks, then evict the least recently used. A
        sequence's later blocks count as used less recently than its earlier ones (as vLLM
        frees them), so a long sequence loses its tail first, never its head."""
        if not self.capacity_blocks:
            return
        blocks = self._blocks
        for key in reversed(keys):
            if key in blocks:
                blocks.move_to_end(key)
            else:
                blocks[key] = None
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
            self.evicted_blocks += 1
