"""Prompts of a requested token length, unique per request.

A prompt is a run of pieces (locustfiles/pieces.py), each of which counts as one token:
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
prefix-cache hits) unless `shared_prefix_tokens` asks for one.

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
from typing import Any

from analysis.errors import UsageError
from locustfiles.pieces import WORDS, choose_pieces, word_pieces

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


class TokenCounter:
    """A tokenizer's count of text, for exact prompts and per-event token counts.

    `encode` is all that counting needs; building prompts from the tokenizer's own tokens
    also needs `decode_many` (token id lists to texts), `vocab_size` and `special` (id ->
    text of the added/special tokens). The `*_many` forms default to one call per item."""

    def __init__(
        self,
        encode: Callable[[str], list[int]],
        name: str,
        *,
        encode_many: Callable[[list[str]], list[list[int]]] | None = None,
        decode_many: Callable[[list[list[int]]], list[str]] | None = None,
        vocab_size: int = 0,
        special: dict[int, str] | None = None,
    ) -> None:
        self._encode = encode
        self._encode_many = encode_many
        self._decode_many = decode_many
        self.name = name
        self.vocab_size = vocab_size if decode_many is not None else 0
        self.special = special or {}

    def count(self, text: str) -> int:
        return len(self._encode(text)) if text else 0

    def ids(self, texts: list[str]) -> list[list[int]]:
        if self._encode_many is not None:
            return self._encode_many(texts)
        return [self._encode(t) for t in texts]

    def counts(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.ids(texts)]

    def decode(self, ids: list[int]) -> str:
        return self.decode_many([ids])[0]

    def decode_many(self, ids: list[list[int]]) -> list[str]:
        if self._decode_many is None:
            raise TypeError(f"tokenizer {self.name} cannot decode")
        return self._decode_many(ids)


def _from_tokenizers(tok: Any, name: str) -> TokenCounter:
    """A TokenCounter over a `tokenizers.Tokenizer`."""
    return TokenCounter(
        lambda t: tok.encode(t, add_special_tokens=False).ids,
        name,
        encode_many=lambda ts: [e.ids for e in tok.encode_batch(ts, add_special_tokens=False)],
        decode_many=lambda ids: tok.decode_batch(ids, skip_special_tokens=False),
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        special={i: t.content for i, t in tok.get_added_tokens_decoder().items()},
    )


def _from_transformers(hf: Any, name: str) -> TokenCounter:
    """A TokenCounter over a transformers tokenizer."""
    return TokenCounter(
        lambda t: hf.encode(t, add_special_tokens=False),
        name,
        encode_many=lambda ts: hf(ts, add_special_tokens=False)["input_ids"],
        decode_many=lambda ids: hf.batch_decode(ids, skip_special_tokens=False),
        vocab_size=len(hf),
        special={i: str(t) for i, t in hf.added_tokens_decoder.items()},
    )


def load_tokenizer(path_or_name: str) -> TokenCounter:
    """A local tokenizer directory or tokenizer.json file, or a name resolvable offline."""
    from pathlib import Path

    path = Path(path_or_name)
    tok_file = path / "tokenizer.json" if path.is_dir() else path
    if not path.exists() and (path.is_absolute() or path_or_name.startswith(".") or path.suffix):
        raise UsageError(
            f"cannot load tokenizer {path_or_name!r}: no such file or directory; give a local "
            "directory with tokenizer.json or a tokenizer.json file that exists on this host"
        )
    try:
        if tok_file.is_file():
            from tokenizers import Tokenizer

            tok: Any = Tokenizer.from_file(str(tok_file))
            return _from_tokenizers(tok, str(path))
        try:
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(path_or_name)
            return _from_transformers(hf, path_or_name)
        except ImportError:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_pretrained(path_or_name)
            return _from_tokenizers(tok, path_or_name)
    except ImportError as exc:
        raise UsageError(
            "--tokenizer needs the 'tokenizers' package; pip install 'llmload[tokenizer]'"
        ) from exc
    except Exception as exc:  # the libraries raise many kinds; all mean "cannot load it"
        raise UsageError(
            f"cannot load tokenizer {path_or_name!r} ({type(exc).__name__}); give a local "
            "directory with tokenizer.json, a tokenizer.json file, or a name available offline"
        ) from exc


class PromptBuilder:
    """Builds prompt texts of a requested token count from seeded pieces (module docstring)."""

    def __init__(
        self,
        seed: int,
        counter: TokenCounter | None = None,
        shared_prefix_tokens: int = 0,
    ) -> None:
        self.counter = counter
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
        self.shared_prefix = [anchor, *rng.choices(pool, k=more)]
        self.calibration = Calibration()
        self.inexact = 0  # prompts sent a token count off the tokenizer's (non-exact pieces)
        self._warned_short = False

    def text(self, units: int, rng: random.Random) -> str:
        """A prompt of exactly `units` tokens of the tokenizer (without one: `units` words):
        the anchor and shared prefix, pieces drawn one by one, then a run of the corpus."""
        parts = self._parts(units, rng)
        if self.counter is None or self.pieces.exact:
            return "".join(parts)
        return self._fit(parts, units, rng)

    def _parts(self, units: int, rng: random.Random) -> list[str]:
        rest = units - self.pieces.anchor_tokens + 1  # pieces after the anchor, plus one
        parts = self.shared_prefix[: max(1, rest)]
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

    def calibrate(
        self, probe: Callable[[str], int | None], small: int = 16, large: int = 272
    ) -> Calibration:
        """Fit the server's count: `probe(text)` returns usage.prompt_tokens (None if unknown).

        With a tokenizer the fit is against its own count of the two probes: one server token
        per token (exact prompts) unless the server counts differently (a warning)."""
        rng = random.Random(0)
        texts = [self.text(small, rng), self.text(large, rng)]
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


def prompt_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
