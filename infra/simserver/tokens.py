"""The simulator's tokenizer: how prompt tokens are counted and how output text is made.

Counting rule (documented in docs/simserver.md, relied on by `usage`): a text's token count
is the number of whitespace-separated words, i.e. `len(text.split())` in Python. A list of
integers (a pre-tokenised `/v1/completions` prompt) counts one token per integer.

Every output token is one word preceded by a space (b" word"), so the same rule counts the
generated text exactly: `count_tokens(text) == usage.completion_tokens`.
"""

from __future__ import annotations

import random

_SYLLABLES = (
    "ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "da",
    "fe", "gu", "ha", "jo", "pi", "wa", "no", "re", "su", "te",
)  # fmt: skip
_VOCAB_SIZE = 512
_STREAM_LENGTH = 4096


def tokenize(text: str) -> list[str]:
    """The documented rule: a text's tokens are its whitespace-separated words."""
    return text.split()


def count_tokens(text: str) -> int:
    """The documented rule: the number of whitespace-separated words."""
    return len(text.split())


class TokenText:
    """Deterministic output words derived from a seed.

    A fixed cyclic stream of `_STREAM_LENGTH` words is drawn from a vocabulary once; each
    request starts at an offset (drawn by the caller from its seeded generator) and reads on.
    """

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        vocab: list[bytes] = []
        seen: set[bytes] = set()
        while len(vocab) < _VOCAB_SIZE:
            word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))).encode()
            if word not in seen:
                seen.add(word)
                vocab.append(word)
        self._words: list[bytes] = [b" " + rng.choice(vocab) for _ in range(_STREAM_LENGTH)]
        # Doubled so that any slice shorter than the stream needs no wrap-around.
        self._doubled = self._words + self._words

    @property
    def period(self) -> int:
        return _STREAM_LENGTH

    def text(self, start: int, count: int) -> bytes:
        """`count` tokens beginning at stream position `start` (any non-negative integer)."""
        if count <= 0:
            return b""
        start %= _STREAM_LENGTH
        if count <= _STREAM_LENGTH:
            return b"".join(self._doubled[start : start + count])
        whole, rest = divmod(count, _STREAM_LENGTH)
        cycle = b"".join(self._doubled[start : start + _STREAM_LENGTH])
        return cycle * whole + b"".join(self._doubled[start : start + rest])
