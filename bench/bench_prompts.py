"""Time PromptBuilder: start-up (choosing the pieces) and one prompt of 1,000 / 2,000 tokens.

Tokenizers trained here, as in the engine suite (infra/engines/tiny_llama.py): the tiny
Llama's 1,024-token byte-level BPE (prompts of llmload's words), its 400-token variant
trained on made-up words (prompts of the tokenizer's own tokens), the same 400-token BPE
without the pre-tokenizer's word split (merges cross spaces: each prompt re-encoded), and no
tokenizer at all.

    .venv/bin/python bench/bench_prompts.py [--prompts N]
"""

from __future__ import annotations

import argparse
import platform
import random
import time
from typing import Any

from infra.engines.tiny_llama import corpus, recipe_for, train_tokenizer
from locustfiles.request.tokenizer import TokenCounter, _from_tokenizers
from locustfiles.traffic.prompts import PromptBuilder


def glued_bpe() -> Any:
    """A 400-token byte-level BPE trained without splitting words: merges cross spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    recipe = recipe_for(small_vocab=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False
    )
    tok.train_from_iterator(corpus(recipe["seed"], 5000, recipe["corpus"]), trainer)
    return tok


def tokenizers() -> dict[str, TokenCounter | None]:
    return {
        "tiny Llama BPE, 1,024 tokens": _from_tokenizers(train_tokenizer(recipe_for()), "1024"),
        "byte-level BPE, 400 tokens": _from_tokenizers(
            train_tokenizer(recipe_for(small_vocab=True)), "400"
        ),
        "BPE 400, no word split": _from_tokenizers(glued_bpe(), "glued"),
        "no tokenizer": None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2000, help="prompts timed per length")
    args = parser.parse_args()
    print(f"Python {platform.python_version()}, {platform.machine()}")
    print("| tokenizer | pieces | start-up | 1,000 tokens | 2,000 tokens |")
    print("|---|---|---|---|---|")
    for name, counter in tokenizers().items():
        started = time.perf_counter()
        builder = PromptBuilder(0, counter)
        startup = time.perf_counter() - started
        cells = []
        for tokens in (1000, 2000):
            rng = random.Random(1)
            n = args.prompts if builder.pieces.exact or counter is None else args.prompts // 20
            started = time.perf_counter()
            for _ in range(n):
                builder.build(tokens, rng)
            cells.append(f"{(time.perf_counter() - started) / n * 1e6:,.0f} µs")
        pieces = builder.pieces.describe() if counter else "built-in words, calibrated"
        print(f"| {name} | {pieces} | {startup * 1e3:,.0f} ms | "
              f"{cells[0]} | {cells[1]} |")  # fmt: skip


if __name__ == "__main__":
    main()
