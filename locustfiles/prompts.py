"""Prompts of a requested token length, unique per request.

A prompt is a run of vocabulary words, each of which counts as exactly one token:
- with a tokenizer (`--tokenizer`), the vocabulary is filtered to words the tokenizer encodes
  as one token after a space, so N words are exactly N tokens of content;
- without one, built-in words are used and `calibrate()` fits the server's own count
  (`usage.prompt_tokens` of two probe prompts) to a line `tokens = overhead + per_word * words`.

Either way the chat template's extra tokens (`overhead`) are learnt from the server when it
reports usage, so the server's `prompt_tokens` matches the request. Requested and
server-reported lengths are both recorded for every request.

Each prompt starts at a random place in a long shuffled corpus, so two requests share no
prefix (no accidental prefix-cache hits) unless `shared_prefix_tokens` asks for one.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from analysis.errors import UsageError

log = logging.getLogger("llmload.prompts")

# Common short English words; most tokenizers encode " word" as one token.
_WORDS_TEXT = """the of and to in is was for on are with as be at by this had not but from or have
an they which one you were all we her she there been if more when will would who so no time
out up about into than them can only other new some could these two may first then do any
like my now over such our man me even most made after also did many off before must well back
through years much where your way down should because each just those people how too little
state good very make world still own see men work long get here between both life being under
never day same another know while last might great old year come since against go came right
used take three states himself few house use during without again place around however home
small found thought went say part once general high upon school every does got united left
number course war until always away something fact though water less public put think almost
hand enough far took head yet government system better set told nothing night end why called
did eyes find going look asked later knew point next program city business give group toward
young days let room president side social given present several order national possible rather
second face per among form important often things looked early white case john become large
big need four within felt along children saw best church ever least power development light
thing seemed family interest want members mind country area others done turned although open
god service certain kind problem began different door thus help sense means whole matter
perhaps itself york times law human line above name example action company hands local show
whether five history gave today either act feet across taken past quite anything seen having
death experience body word half really week car field information words money"""
_WORDS = _WORDS_TEXT.split()

_CORPUS_WORDS = 200_000


@dataclass
class Calibration:
    """Server tokens = overhead + per_word * words; found from probes, or the identity."""

    overhead: float = 0.0
    per_word: float = 1.0
    source: str = "assumed"  # assumed | server

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.overhead) / self.per_word))


class TokenCounter:
    """A tokenizer's count of text, for exact prompts and per-event token counts."""

    def __init__(self, encode: Callable[[str], list[int]], name: str) -> None:
        self._encode = encode
        self.name = name

    def count(self, text: str) -> int:
        return len(self._encode(text)) if text else 0

    def single_token_words(self, words: list[str]) -> list[str]:
        return [w for w in words if len(self._encode(" " + w)) == 1]


def load_tokenizer(path_or_name: str) -> TokenCounter:
    """A local tokenizer directory or tokenizer.json file, or a name resolvable offline."""
    from pathlib import Path

    path = Path(path_or_name)
    tok_file = path / "tokenizer.json" if path.is_dir() else path
    try:
        if tok_file.is_file():
            from tokenizers import Tokenizer

            tok: Any = Tokenizer.from_file(str(tok_file))
            return TokenCounter(lambda t: tok.encode(t, add_special_tokens=False).ids, str(path))
        try:
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(path_or_name)
            return TokenCounter(lambda t: hf.encode(t, add_special_tokens=False), path_or_name)
        except ImportError:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_pretrained(path_or_name)
            return TokenCounter(lambda t: tok.encode(t, add_special_tokens=False).ids, path_or_name)
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
    """Builds prompt texts of a requested token count from a seeded corpus."""

    def __init__(
        self,
        seed: int,
        counter: TokenCounter | None = None,
        shared_prefix_tokens: int = 0,
    ) -> None:
        words = _WORDS
        if counter is not None:
            words = counter.single_token_words(_WORDS)
            if len(words) < 50:
                raise UsageError(
                    f"tokenizer {counter.name} encodes too few plain words as one token "
                    f"({len(words)}); exact prompt lengths need at least 50"
                )
        self.vocabulary = words
        self.counter = counter
        rng = random.Random(f"llmload-prompts:{seed}")
        self._corpus = rng.choices(words, k=_CORPUS_WORDS)
        self._rng = rng
        self.calibration = Calibration()
        self.shared_prefix = rng.choices(words, k=shared_prefix_tokens)
        self._warned_short = False

    def words(self, n_words: int, rng: random.Random) -> str:
        """`n_words` words starting at a random place (plus the shared prefix, if any)."""
        prefix = self.shared_prefix[:n_words]
        rest = n_words - len(prefix)
        parts: list[str] = list(prefix)
        while rest > 0:
            start = rng.randrange(_CORPUS_WORDS)
            take = min(rest, _CORPUS_WORDS - start)
            parts.extend(self._corpus[start : start + take])
            rest -= take
        return " ".join(parts)

    def build(self, tokens: int, rng: random.Random) -> str:
        """A prompt the server should count as `tokens` prompt tokens."""
        cal = self.calibration
        if tokens < cal.overhead + cal.per_word and not self._warned_short:
            self._warned_short = True
            log.warning(
                "llmload: a prompt of %d tokens is shorter than the server's template adds "
                "(%.0f tokens) plus one word: such prompts are sent with one word and come out "
                "longer (requested and actual lengths are both recorded)", tokens, cal.overhead,
            )  # fmt: skip
        return self.words(cal.words_for(tokens), rng)

    def calibrate(
        self, probe: Callable[[str], int | None], small: int = 16, large: int = 272
    ) -> Calibration:
        """Fit the server's count: `probe(text)` returns usage.prompt_tokens (None if unknown)."""
        rng = random.Random(0)
        p_small = probe(self.words(small, rng))
        p_large = probe(self.words(large, rng))
        if p_small is None or p_large is None or p_large <= p_small:
            return self.calibration
        per_word = 1.0 if self.counter is not None else (p_large - p_small) / (large - small)
        self.calibration = Calibration(p_small - per_word * small, per_word, "server")
        return self.calibration


def prompt_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
