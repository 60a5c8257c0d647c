"""Prompts of an exact token count with any tokenizer (locustfiles/traffic/prompts.py, pieces.py).

Every tokenizer here is trained or built in the test with the `tokenizers` library, on a
narrow corpus of made-up words (so few of llmload's English words are one token):
byte-level BPE (GPT-2 style), Unigram with Metaspace (SentencePiece style), BPE with
SentencePiece's normalizer (Llama 2 style), WordPiece (BERT style), character level,
byte-level BPE without the pre-tokenizer's word split (merges cross spaces: each prompt is
re-encoded and adjusted), and a word-level one over llmload's own words.
"""

from __future__ import annotations

import functools
import json
import logging
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from analysis.kernel.errors import UsageError
from locustfiles.request.tokenizer import TokenCounter, load_tokenizer
from locustfiles.traffic.pieces import MIN_PIECES, WORDS
from locustfiles.traffic.prompts import PromptBuilder

tokenizers = pytest.importorskip("tokenizers")

SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
LENGTHS = [*range(1, 301), *range(301, 2001, 37), 2000]
TEMPLATES = ("<|user|> {}\n<|assistant|>", "user\n{}\nassistant", "<s>[INST] {} [/INST]")


@functools.cache
def corpus(lines: int = 3000) -> list[str]:
    """Sentences of made-up words: nothing like llmload's English words."""
    rng = random.Random(0)
    return [
        " ".join("".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))) for _ in range(12)) + "."
        for _ in range(lines)
    ]


def byte_bpe(split_words: bool = True) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split_words)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False
    )
    tok.train_from_iterator(corpus(), trainer)
    return tok


def unigram() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>",
        show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(corpus()[:300], trainer)  # enough, and 10 times faster
    return tok


def sentencepiece_bpe() -> object:
    """Llama 2 / Mistral style: BPE merges that never cross a word, no pre-tokenizer, and a
    normalizer that puts "▁" before the text and for every space ("a" is "▁a" at the start)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")  # to train only
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    tok.train_from_iterator(corpus(), trainer)
    # no pre-tokenizer from here on (tokenizers 0.19 cannot assign None: edit the JSON)
    doc = json.loads(tok.to_str())
    doc["pre_tokenizer"] = None
    tok = Tokenizer.from_str(json.dumps(doc))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
         decoders.Strip(" ", 1, 0)]
    )  # fmt: skip
    return tok


def wordpiece() -> object:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=400, special_tokens=["[UNK]", "[CLS]", "[SEP]"], show_progress=False
    )
    tok.train_from_iterator(corpus(), trainer)
    return tok


def characters() -> object:
    from tokenizers import Tokenizer, decoders, models

    alphabet = [chr(c) for c in range(32, 127)]
    vocab = {"[UNK]": 0, **{c: i + 1 for i, c in enumerate(alphabet)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    tok.add_special_tokens(["[UNK]"])
    tok.decoder = decoders.Fuse()
    return tok


def word_level() -> object:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(WORDS))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


BUILDERS: dict[str, Callable[[], object]] = {
    "byte-bpe": byte_bpe,
    "unigram": unigram,
    "sentencepiece-bpe": sentencepiece_bpe,
    "wordpiece": wordpiece,
    "characters": characters,
    "bpe-no-word-split": lambda: byte_bpe(split_words=False),
    "word-level": word_level,
}
# (kind of piece, exact by construction) each tokenizer gets
EXPECTED = {
    "byte-bpe": ("vocabulary", True),
    "unigram": ("vocabulary", True),
    "sentencepiece-bpe": ("vocabulary", True),
    "wordpiece": ("vocabulary", True),
    "characters": ("vocabulary", True),
    "bpe-no-word-split": ("vocabulary", False),
    "word-level": ("words", True),
}
EXACT = [name for name, (_, exact) in EXPECTED.items() if exact]


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    files = {}
    for name, build in BUILDERS.items():
        files[name] = root / name / "tokenizer.json"
        files[name].parent.mkdir()
        build().save(str(files[name]))  # type: ignore[attr-defined]
    return files


@pytest.fixture(scope="module")
def counters(tokenizer_files: dict[str, Path]) -> dict[str, TokenCounter]:
    return {name: load_tokenizer(str(path)) for name, path in tokenizer_files.items()}


@pytest.fixture(scope="module")
def builders(counters: dict[str, TokenCounter]) -> dict[str, PromptBuilder]:
    return {name: PromptBuilder(7, counter) for name, counter in counters.items()}


def test_the_narrow_byte_level_bpe_has_too_few_whole_words(counters: dict[str, TokenCounter]):
    """The case whole words cannot serve (it used to stop the run with a UsageError)."""
    counter = counters["byte-bpe"]
    assert counter.vocab_size < 1000
    single = sum(n == 1 for n in counter.counts([" " + w for w in dict.fromkeys(WORDS)]))
    assert single < MIN_PIECES


@pytest.mark.parametrize("name", list(BUILDERS))
def test_prompts_have_the_exact_token_count(
    name: str, counters: dict[str, TokenCounter], builders: dict[str, PromptBuilder]
) -> None:
    builder, counter = builders[name], counters[name]
    assert (builder.pieces.kind, builder.pieces.exact) == EXPECTED[name]
    rng = random.Random(1)
    texts = [builder.text(n, rng) for n in LENGTHS]
    assert counter.counts(texts) == LENGTHS
    assert builder.inexact == 0
    assert all(t == t.strip() and t.isprintable() for t in texts)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_prompts_are_unique_and_reproducible(
    name: str, counters: dict[str, TokenCounter], builders: dict[str, PromptBuilder]
) -> None:
    builder = builders[name]
    rng = random.Random(2)
    texts = [builder.text(64, rng) for _ in range(300)]
    assert len(set(texts)) == len(texts)
    # no two share their first 12 tokens: no accidental prefix-cache hit beyond the anchor
    starts = {tuple(ids[:12]) for ids in counters[name].ids(texts)}
    assert len(starts) == len(texts)
    again = PromptBuilder(7, counters[name])
    rng = random.Random(2)
    assert [again.text(64, rng) for _ in range(300)] == texts
    other = PromptBuilder(8, counters[name])
    rng = random.Random(2)
    assert [other.text(64, rng) for _ in range(300)] != texts


@pytest.mark.parametrize("name", EXACT)
def test_exact_pieces_build_prompts_without_calling_the_tokenizer(
    name: str, counters: dict[str, TokenCounter]
) -> None:
    calls = []
    counter = counters[name]
    spy = TokenCounter(lambda t: calls.append(t) or counter.ids([t])[0], "spy")
    builder = PromptBuilder(7, counter)
    builder.counter = spy
    rng = random.Random(3)
    for n in (1, 100, 2000):
        builder.text(n, rng)
    assert calls == []


@pytest.mark.parametrize("name", EXACT)
def test_a_shared_prefix_is_exactly_its_tokens(
    name: str, counters: dict[str, TokenCounter]
) -> None:
    counter = counters[name]
    builder = PromptBuilder(7, counter, shared_prefix_tokens=40)
    rng = random.Random(4)
    texts = [builder.text(n, rng) for n in (40, 41, 100, 100, 300)]
    encoded = counter.ids(texts)
    assert [len(ids) for ids in encoded] == [40, 41, 100, 100, 300]
    assert len({tuple(ids[:40]) for ids in encoded}) == 1
    assert len({tuple(ids[40:52]) for ids in encoded[1:]}) == 4
    short = builder.text(10, rng)
    assert counter.ids([short])[0] == encoded[0][:10]


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("name", list(BUILDERS))
def test_calibrated_prompts_are_exact_inside_the_chat_template(
    name: str, template: str, counters: dict[str, TokenCounter]
) -> None:
    """The server counts the prompt inside its chat template: the probes learn the template's
    tokens (and how it joins the prompt's first piece), and every prompt then comes out at
    the requested length."""
    counter = counters[name]
    builder = PromptBuilder(7, counter)

    def server(text: str) -> int:
        return counter.count(template.format(text))

    calibration = builder.calibrate(server)
    assert calibration.source == "server" and calibration.per_unit == 1.0
    rng = random.Random(5)
    wanted = [*range(int(calibration.overhead) + 1, 200), 1000, 2000]
    assert [server(builder.build(n, rng)) for n in wanted] == wanted


def test_a_tokenizer_that_is_not_the_servers_is_fitted_and_named(
    counters: dict[str, TokenCounter], caplog: pytest.LogCaptureFixture
) -> None:
    builder = PromptBuilder(7, counters["byte-bpe"])
    other = counters["characters"]
    with caplog.at_level(logging.WARNING, logger="llmload.prompts"):
        calibration = builder.calibrate(lambda text: other.count(text) + 5)
    assert calibration.per_unit != 1.0
    assert "not the served model's tokenizer" in caplog.text


def test_without_a_tokenizer_calibration_fits_a_word_counting_server() -> None:
    """The simulator counts whitespace words (plus a template here): exact after the probes."""
    builder = PromptBuilder(7)
    calibration = builder.calibrate(lambda text: len(text.split()) + 9)
    assert (calibration.overhead, calibration.per_unit) == (9.0, 1.0)
    rng = random.Random(6)
    for n in range(10, 400, 7):
        assert len(builder.build(n, rng).split()) + 9 == n


def test_a_tokenizer_without_usable_tokens_is_refused(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.add_special_tokens(["[UNK]"])
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    counter = load_tokenizer(str(tmp_path / "tokenizer.json"))
    with pytest.raises(UsageError) as err:
        PromptBuilder(7, counter)
    message = str(err.value)
    assert "\n" not in message
    assert "no token that decodes to plain text" in message and "--tokenizer" in message
