"""Prompts of a requested token length, unique per request.

A prompt is a run of pieces (locustfiles/traffic/pieces.py), each of which counts as one token:
- with a tokenizer (`--tokenizer`), the pieces are built-in English words the tokenizer
  encodes as one token after a space or, when too few are, the tokenizer's own tokens as
  text; the local count of a prompt is exact (by construction, or re-encoded and adjusted);
- without one, the pieces are the built-in words and `calibrate()` fits the server's own count
  (`usage.prompt_tokens` of two probe prompts) to a line `tokens = overhead + per_unit * words`.

Either way the chat template's extra tokens (`overhead`) are learnt from the server when it
reports usage, so the server's `prompt_tokens` matches the request. Every prompt starts with
the same piece (the anchor), so the template's text joins every prompt the same way and the
probes measure that join too. Requested and server-reported lengths are both recorded for
every request.

Each prompt continues with a few pieces drawn at random and then a run of a long shuffled
corpus from a random place, so two requests share no prefix beyond the anchor (no accidental
prefix-cache hits) unless `shared_prefix_tokens` asks for one. With `prefix_groups` G > 1
there are G such prefixes (`--prefix-groups`, `--prefix-tokens`), drawn from the seed one
after the other: alike but for the anchor, so the engine's cache holds each group's blocks
apart; each prompt starts with one of them, picked by the caller's seeded generator
(`prime_text` is a prefix on its own, to warm the cache with: `--cache-phase prime`).

Cost per prompt of 2,000 tokens (bench/bench_prompts.py, docs/benchmarks.md): about 20 us
when the pieces are exact by construction (no tokenizer call), about 2 ms when each prompt
must be re-encoded (a tokenizer whose merges cross spaces).
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from locustfiles.request.tokenizer import TokenCounter
from locustfiles.traffic.pieces import WORDS, choose_pieces, word_pieces

log = logging.getLogger("llmload.prompts")

_WORDS = WORDS  # the built-in words under their former name (tests make tokenizers of them)
_CORPUS_PIECES = 200_000
_MAX_FIXES = 24  # adjustments of one prompt before it is sent as it is (non-exact pieces)


@dataclass
class Calibration:
    """Server tokens = overhead + per_unit * units; found from probes, or the identity.

    Units are the tokenizer's tokens with `--tokenizer` (per_unit 1 when it is the served
    model's tokenizer), else words."""

    overhead: float = 0.0
    per_unit: float = 1.0
    source: str = "assumed"  # assumed | server

    def units_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.overhead) / self.per_unit))


class PromptBuilder:
    """Builds prompt texts of a requested token count from seeded pieces (module docstring)."""

    def __init__(
        self,
        seed: int,
        counter: TokenCounter | None = None,
        shared_prefix_tokens: int = 0,
        prefix_groups: int = 1,
    ) -> None:
        self.counter = counter
        self._seed = seed
        self.pieces = word_pieces(seed) if counter is None else choose_pieces(counter, seed)
        if counter is not None:
            log.info("llmload: prompts for tokenizer %s: %s", counter.name, self.pieces.describe())
        pool = list(self.pieces.texts)
        rng = random.Random(f"llmload-prompts:{seed}")
        self._pool = pool
        self._corpus = rng.choices(pool, k=_CORPUS_PIECES)
        # pieces drawn one by one after the prefix: about 2**48 different starts
        self._head = math.ceil(48 / math.log2(len(pool)))
        anchor = self.pieces.anchor
        more = max(0, shared_prefix_tokens - self.pieces.anchor_tokens)
        self.prefixes = [[anchor, *rng.choices(pool, k=more)] for _ in range(max(1, prefix_groups))]
        self.shared_prefix = self.prefixes[0]  # the one prefix (the first group's)
        self.calibration = Calibration()
        self.inexact = 0  # prompts sent a token count off the tokenizer's (non-exact pieces)
        self._warned_short = False

    def text(self, units: int, rng: random.Random, prefixed: bool = True) -> str:
        """A prompt of exactly `units` tokens of the tokenizer (without one: `units` words):
        the anchor and shared prefix (one group's, drawn from `rng` when there are several;
        none but the anchor when not `prefixed`), pieces drawn one by one, then a run of the
        corpus."""
        parts = self._parts(units, rng, prefixed)
        if self.counter is None or self.pieces.exact:
            return "".join(parts)
        return self._fit(parts, units, rng)

    def _parts(self, units: int, rng: random.Random, prefixed: bool = True) -> list[str]:
        rest = units - self.pieces.anchor_tokens + 1  # pieces after the anchor, plus one
        prefixes = self.prefixes
        prefix = prefixes[rng.randrange(len(prefixes))] if len(prefixes) > 1 else prefixes[0]
        parts = (prefix if prefixed else prefix[:1])[: max(1, rest)]
        rest -= len(parts)
        if rest <= 0:
            return parts
        head = min(rest, self._head)
        parts = parts + rng.choices(self._pool, k=head)
        rest -= head
        while rest > 0:
            start = rng.randrange(_CORPUS_PIECES)
            take = min(rest, _CORPUS_PIECES - start)
            parts += self._corpus[start : start + take]
            rest -= take
        return parts

    def _fit(self, parts: list[str], units: int, rng: random.Random) -> str:
        """Re-encode and add or drop pieces before the last until the count is exactly
        `units`. The last piece is always the same (the tail), so that the template's text
        after a prompt meets every prompt the same way."""
        assert self.counter is not None
        tail = self._pool[0] if len(parts) > 1 else ""
        parts = parts[:-1] if tail else list(parts)
        text = "".join(parts) + tail
        got = self.counter.count(text)
        for attempt in range(_MAX_FIXES):
            if got == units:
                return text
            if attempt % 4 == 3 and len(parts) > 1:
                parts[-1] = rng.choice(self._pool)  # another last piece breaks a cycle
            elif got < units:
                parts += rng.choices(self._pool, k=units - got)
            elif len(parts) > 1:
                del parts[max(1, len(parts) - (got - units)) :]
            elif tail:
                tail = ""
            else:
                break
            text = "".join(parts) + tail
            got = self.counter.count(text)
        if got != units:
            self.inexact += 1
            if self.inexact == 1:
                log.warning(
                    "llmload: a prompt of %d tokens came out %d with tokenizer %s after %d "
                    "adjustments; such prompts are sent as they are (requested and actual "
                    "lengths are both recorded)", units, got, self.counter.name, _MAX_FIXES,
                )  # fmt: skip
        return text

    def build(self, tokens: int, rng: random.Random) -> str:
        """A prompt the server should count as `tokens` prompt tokens."""
        cal = self.calibration
        shortest = cal.overhead + cal.per_unit * self.pieces.anchor_tokens
        if tokens < shortest and not self._warned_short:
            self._warned_short = True
            log.warning(
                "llmload: a prompt of %d tokens is shorter than the server's template adds "
                "(%.0f tokens) plus one piece: such prompts are sent with one piece and come "
                "out longer (requested and actual lengths are both recorded)",
                tokens, cal.overhead,
            )  # fmt: skip
        return self.text(cal.units_for(tokens), rng)

    def build_blocks(
        self, tokens: int, rng: random.Random, blocks: tuple[int, ...], block_tokens: int
    ) -> str:
        """A prompt of `tokens` prompt tokens that begins with a trace's prefix blocks (its
        hash ids, `block_tokens` each, cut where the prompt ends), then its own pieces.
        Block `h` is the same pieces in every prompt (seeded by the run's seed and `h`; the
        first block starts with the anchor), so prompts with the same leading ids share a
        byte-identical prefix, as long as the blocks' pieces are exact for the tokenizer."""
        cal = self.calibration
        units = cal.units_for(tokens)
        block_units = max(1, round(block_tokens / cal.per_unit))
        anchor_tokens = self.pieces.anchor_tokens
        wanted = max(1, units - anchor_tokens + 1)  # pieces of the prompt, the anchor one
        parts: list[str] = []
        for j, hash_id in enumerate(blocks):
            if len(parts) >= wanted:
                break
            block = random.Random(f"llmload-block:{self._seed}:{hash_id}")
            if j == 0:
                k = max(0, block_units - anchor_tokens)
                parts += [self.pieces.anchor, *block.choices(self._pool, k=k)]
            else:
                parts += block.choices(self._pool, k=block_units)
        parts = parts[:wanted]
        if len(parts) < wanted:  # the prompt's own pieces: as any prompt's after its anchor
            rest = wanted - len(parts) if parts else wanted - 1
            parts = (parts or [self.pieces.anchor]) + self._parts(
                rest + anchor_tokens, rng, prefixed=False
            )[1:]
        if self.counter is None or self.pieces.exact:
            return "".join(parts)
        return self._fit(parts, units, rng)

    def calibrate(
        self, probe: Callable[[str], int | None], small: int = 16, large: int = 272
    ) -> Calibration:
        """Fit the server's count: `probe(text)` returns usage.prompt_tokens (None if unknown).

        With a tokenizer the fit is against its own count of the two probes: one server token
        per token (exact prompts) unless the server counts differently (a warning)."""
        rng = random.Random(0)  # no shared prefix: the probes warm no group's cache blocks
        texts = [self.text(small, rng, prefixed=False), self.text(large, rng, prefixed=False)]
        p_small, p_large = probe(texts[0]), probe(texts[1])
        if p_small is None or p_large is None or p_large <= p_small:
            return self.calibration
        u_small, u_large = self.counter.counts(texts) if self.counter else (small, large)
        per_unit = (p_large - p_small) / (u_large - u_small)
        if self.counter is not None and per_unit != 1.0:
            log.warning(
                "llmload: the server counted %d and %d prompt tokens where tokenizer %s "
                "counts %d and %d: it is not the served model's tokenizer, so prompt lengths "
                "are fitted to the server's count and not exact; give the model's own tokenizer",
                p_small, p_large, self.counter.name, u_small, u_large,
            )  # fmt: skip
        self.calibration = Calibration(p_small - per_unit * u_small, per_unit, "server")
        return self.calibration

    def prime_text(self, group: int, tail: int, rng: random.Random) -> str:
        """Group `group`'s prefix and `tail` pieces drawn from `rng`: a prompt that leaves the
        prefix's blocks in the engine's cache (`--cache-phase prime`)."""
        return "".join([*self.prefixes[group], *rng.choices(self._pool, k=tail)])


def prompt_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
