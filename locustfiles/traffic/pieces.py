"""The pieces prompts are made of: texts that each count as one token, chosen per tokenizer.

A prompt is its pieces joined with nothing between them (a piece carries its own leading
space, as in " the"). Every prompt starts with the same piece, the anchor, written without its
leading space, so the chat template's text meets every prompt the same way and the
calibration probes measure that join once (PromptBuilder).

Without a tokenizer the pieces are llmload's built-in English words. With one, the first
exact kind (below) with MIN_PIECES members is used (else see `choose_pieces`):

1. `words`: the built-in words the tokenizer encodes as one token after a space;
2. `vocabulary`: the tokenizer's own tokens, each as the text it decodes to in the middle of a
   text: word-initial letters (" th"), then any letters ("ing"), then any printable text (a
   character-level tokenizer). Large vocabularies are sampled (MAX_IDS ids examined).

Every piece must be its own one token in the middle of a text (after a reference token:
at the very start some tokenizers add a space, e.g. SentencePiece's "▁"), also between two
other pieces, and hold none of the special tokens' marks (`<|`, `[`), so joined pieces never
spell a special token.

A kind is `exact` when any run of k pieces after the anchor encodes to exactly the anchor's
tokens plus k: checked at start on a long random run (CHECK_PIECES pieces), and true for
tokenizers that split text at spaces before merging or never merge across them (byte-level
BPE, SentencePiece BPE and Unigram, WordPiece, character level). Prompts of an exact kind
need no tokenizer call per request; otherwise each prompt is re-encoded and adjusted
(PromptBuilder).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from analysis.kernel.errors import UsageError

if TYPE_CHECKING:
    from locustfiles.request.tokenizer import TokenCounter

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
WORDS: Final = _WORDS_TEXT.split()
"""The built-in words (with repeats: the corpus draws common words a little more often)."""

MIN_PIECES: Final = 50
"""A kind of piece is used when it has at least this many members (uniqueness, variety)."""

FEW_PIECES: Final = 16
"""An exact kind with this many members is preferred to a larger kind that is not exact."""

MAX_IDS: Final = 32_768
"""Vocabulary ids examined at most (a seeded sample of larger vocabularies)."""

MAX_PIECES: Final = 4_096
"""Pieces kept at most per kind (a seeded sample)."""

CHECK_PIECES: Final = 32_768
"""Length of the random run of pieces that must encode exactly for a kind to be `exact`."""

_TRIALS: Final = 4  # neighbour pairs each candidate piece is tried between


@dataclass(frozen=True)
class Pieces:
    """What prompts are made of (see the module docstring)."""

    kind: str  # words | vocabulary
    texts: tuple[str, ...]  # each as it appears inside a prompt, with its leading space if any
    anchor: str  # every prompt's first piece, without a leading space
    anchor_tokens: int  # the tokenizer's count of the anchor alone (1 without a tokenizer)
    exact: bool  # any k pieces after the anchor encode to exactly anchor_tokens + k tokens

    def describe(self) -> str:
        how = "exact by construction" if self.exact else "re-encoded and adjusted per prompt"
        return f"{len(self.texts)} {self.kind} pieces, {how}"


def word_pieces(seed: int) -> Pieces:
    """The built-in words, for prompts without a tokenizer (lengths are calibrated)."""
    texts = tuple(" " + w for w in dict.fromkeys(WORDS))
    anchor = random.Random(f"llmload-pieces:{seed}").choice(texts).lstrip()
    return Pieces("words", texts, anchor, 1, exact=False)


def choose_pieces(counter: TokenCounter, seed: int) -> Pieces:
    """The kind of piece `counter` makes prompts from (module docstring): the first exact
    kind with MIN_PIECES members, else with FEW_PIECES, else the first kind with MIN_PIECES
    (re-encoded per prompt), else the largest.

    Raises UsageError when the tokenizer has no usable piece at all."""
    rng = random.Random(f"llmload-pieces:{seed}")
    tried: list[Pieces] = []
    largest: tuple[str, list[tuple[str, int]]] = ("words", [])
    for kind, members in _kinds(counter, rng):
        if len(members) >= FEW_PIECES:
            tried.append(_try(counter, kind, members, rng))
            if tried[-1].exact and len(members) >= MIN_PIECES:
                return tried[-1]
        if len(members) > len(largest[1]):
            largest = (kind, members)
    for pieces in tried:
        if pieces.exact:
            return pieces
    for pieces in tried:
        if len(pieces.texts) >= MIN_PIECES:
            return pieces
    if len(largest[1]) >= 2:
        return _try(counter, *largest, rng)
    raise UsageError(
        f"tokenizer {counter.name} has no token that decodes to plain text and encodes back "
        "to itself, so llmload cannot build prompts with it; give the served model's "
        "tokenizer, or leave --tokenizer out (prompt lengths are then calibrated)"
    )


def _kinds(
    counter: TokenCounter, rng: random.Random
) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """Each kind's members as (text, token id), best kind first, examined only when asked."""
    ref = _reference(counter)
    yield "words", _independent(counter, ref[0], _words(counter, ref[0]), rng)
    vocabulary = _vocabulary(counter, ref, rng)
    word_initial = [p for p in vocabulary if p[0][:1] == " " and p[0][1:].isalpha()]
    letters = [p for p in vocabulary if p[0].lstrip(" ").isalpha()]
    for members in (word_initial, letters, vocabulary):
        yield "vocabulary", _independent(counter, ref[0], members, rng)


def _reference(counter: TokenCounter) -> tuple[str, int | None]:
    """A plain token (its text, its id) that texts are examined after, as they would be in
    the middle of a prompt: at the very start of a text, tokenizers may add a space
    (SentencePiece's normalizer) or decoders drop one."""
    for i in range(min(counter.vocab_size, 4096)):
        text = counter.decode([i]).strip() if i not in counter.special else ""
        if text.isalnum():
            return text, i
    return WORDS[0], None


def _after(counter: TokenCounter, ref: str, texts: list[str]) -> list[list[int] | None]:
    """Each text's tokens after the reference text (None when the two merge)."""
    base = counter.ids([ref])[0]
    n = len(base)
    return [ids[n:] if ids[:n] == base else None for ids in counter.ids([ref + t for t in texts])]


def _words(counter: TokenCounter, ref: str) -> list[tuple[str, int]]:
    """Built-in words that are one token after a space, as (" word", token id); a token
    that several words become (an unknown-word token) is no word's."""
    texts = [" " + w for w in dict.fromkeys(WORDS)]
    got = _after(counter, ref, texts)
    single = [(t, ids[0]) for t, ids in zip(texts, got, strict=True) if ids and len(ids) == 1]
    uses = Counter(i for _, i in single)
    return [(t, i) for t, i in single if uses[i] == 1]


def _vocabulary(
    counter: TokenCounter, ref: tuple[str, int | None], rng: random.Random
) -> list[tuple[str, int]]:
    """Tokens as (text inside a text, id), printable and encoding back to themselves."""
    if ref[1] is None:
        return []
    ids = [i for i in range(counter.vocab_size) if i not in counter.special]
    if len(ids) > MAX_IDS:
        ids = sorted(rng.sample(ids, MAX_IDS))
    # a token's text inside a text: decoded after the reference token, whose text is cut off
    ref_text = counter.decode([ref[1]])
    marks = {c for text in counter.special.values() for c in text if not c.isalnum()}
    found: list[tuple[str, int]] = []
    for i, text in zip(ids, counter.decode_many([[ref[1], i] for i in ids]), strict=True):
        if not text.startswith(ref_text):
            continue
        piece = text[len(ref_text) :]
        body = piece[1:] if piece[:1] == " " else piece
        if (
            body
            and piece.isprintable()
            and "\ufffd" not in body  # a partial UTF-8 sequence
            and not any(c.isspace() for c in body)
            and not marks.intersection(body)
        ):
            found.append((piece, i))
    got = _after(counter, ref[0], [t for t, _ in found])
    return [(t, i) for (t, i), ids_ in zip(found, got, strict=True) if ids_ == [i]]


def _independent(
    counter: TokenCounter, ref: str, members: list[tuple[str, int]], rng: random.Random
) -> list[tuple[str, int]]:
    """Members that stay their own token between two others (tried twice: the second time
    only between members that passed the first, so a bad neighbour rejects no good piece)."""
    members = members if len(members) <= MAX_PIECES else rng.sample(members, MAX_PIECES)
    partners = members
    for _ in range(2):
        if len(partners) < 2:
            return partners
        texts, expected = [], []
        for text, i in members:
            for _ in range(_TRIALS):
                (a, ai), (b, bi) = rng.choice(partners), rng.choice(partners)
                texts.append(a + text + b)
                expected.append([ai, i, bi])
        got = _after(counter, ref, texts)
        partners = [
            m
            for n, m in enumerate(members)
            if all(got[k] == expected[k] for k in range(n * _TRIALS, (n + 1) * _TRIALS))
        ]
    return partners


def _try(
    counter: TokenCounter, kind: str, members: list[tuple[str, int]], rng: random.Random
) -> Pieces:
    """Pieces of one kind with the best of a few anchors (the fewest tokens alone, then the
    fewest misses); `exact` when the anchor followed by each piece, and by a long random run
    of pieces, encodes to exactly the tokens expected."""
    members = sorted(members, key=lambda m: m[1])  # the same order however they were found
    rng.shuffle(members)
    texts = tuple(t for t, _ in members)
    candidates = [t.lstrip(" ") for t in texts[:16]]
    counted = zip(counter.counts(candidates), range(16), candidates, strict=False)
    anchors = sorted(a for a in counted if a[0] >= 1) or [(1, 0, candidates[0])]
    run = rng.choices(texts, k=CHECK_PIECES)
    runs = [run[k : k + 1024] for k in range(0, len(run), 1024)]
    best: tuple[int, Pieces] | None = None
    for tokens, _, anchor in anchors[:4]:
        probes = [anchor + t for t in texts] + [anchor + "".join(r) for r in runs]
        want = [tokens + 1] * len(texts) + [tokens + len(r) for r in runs]
        misses = sum(g != w for g, w in zip(counter.counts(probes), want, strict=True))
        pieces = Pieces(kind, texts, anchor, tokens, exact=misses == 0)
        if misses == 0:
            return pieces
        if best is None or misses < best[0]:
            best = (misses, pieces)
    assert best is not None
    return best[1]
