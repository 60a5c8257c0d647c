"""A tiny random-weight Llama with a locally trained BPE tokenizer: a real model, no hub.

    python -m infra.engines.tiny_llama OUT_DIR [--no-eos] [--small-vocab] [--head-dim-64] [--think]
                                               [--force]

writes a `save_pretrained` directory (config, safetensors weights, generation config,
tokenizer with a chat template) that `transformers serve OUT_DIR` loads offline, and that
llmload takes as `--tokenizer OUT_DIR`. Building takes a few seconds on a CPU; a directory
already built with the same recipe is reused (`llmload_tiny_llama.json` records the recipe).

The tokenizer is byte-level BPE trained on ASCII text only (llmload's prompt words in
generated sentences), so every token decodes to plain ASCII and every streamed delta can be
re-counted exactly. It has one special token, `<|endoftext|>` (BOS = EOS = PAD), and a chat
template whose role markers are plain text, so a random model rarely emits a token with no
text. The chat template puts a space before the message, so each of llmload's prompt words
is exactly one token and the template adds a constant number of tokens.

`--no-eos` builds the same model with `suppress_tokens: [EOS]` in its generation config: it
never emits its EOS (nor any other token without text), so every request runs to its
`max_tokens` and every token arrives as text — forced output lengths on a server that
refuses `ignore_eos`, set at launch for all requests.

`--small-vocab` builds it with a byte-level BPE of 400 tokens trained on made-up words
instead: fewer than 50 of llmload's prompt words are one token, so exact prompts must be made
of the tokenizer's own tokens (locustfiles/traffic/pieces.py), and without a tokenizer the prompt
calibration cannot be exact (each word takes a varying number of tokens).

`--head-dim-64` builds it with attention heads of 64 dimensions (hidden size 128, 2 heads,
2 KV heads, intermediate size 256) instead of 16: vLLM's CPU attention kernel refuses head
sizes below 32 (the vLLM suite, tests/engine/test_vllm.py, serves this variant).

`--think` adds two tokens to the vocabulary, `<think>` and `</think>` (plain added tokens,
not special: they decode to their text), the markers of a DeepSeek-R1-style reasoning parser
(`vllm serve --reasoning-parser deepseek_r1`). The corpus has no `<`, so each marker can only
be emitted as its one token: a grammar that spells `<think>...</think>...` makes the random
model cross the parser's boundary where the grammar says (tests/engine/test_vllm.py). It also
adds JSON's braces, brackets and quote to the alphabet, so that a JSON grammar (structured
outputs) can spell its output.

Needs torch, transformers and tokenizers: the engine environment (requirements-engine.txt)
or vLLM's (requirements-vllm.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

MARKER = "llmload_tiny_llama.json"
SPECIAL = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# The recipe: a directory whose marker holds the same recipe is reused as it is.
RECIPE: dict[str, Any] = {
    "recipe": 1,
    "seed": 0,
    "vocab_size": 1024,
    "corpus_lines": 20_000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "chat_template": CHAT_TEMPLATE,
    # Sampling over the whole vocabulary: varied token texts, and an EOS now and then
    # (~1 in 1,000 tokens) so some requests stop before their cap. Greedy decoding of random
    # weights repeats one token forever.
    "generation": {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0},
}
# What --small-vocab changes in the recipe.
SMALL_VOCAB: dict[str, Any] = {"vocab_size": 400, "corpus": "made-up words"}
# What --think adds: the reasoning markers, as tokens of their own
THINK: dict[str, Any] = {"added_tokens": ["<think>", "</think>"], "alphabet": list('{}[]"')}
# What --head-dim-64 changes: head size 128 / 2 = 64, the smallest vLLM's CPU kernel takes.
HEAD_DIM_64: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
}
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def made_up_words(rng: random.Random, count: int = 2000) -> list[str]:
    """Words of one to four syllables (consonant + vowel): nothing like English."""
    syllables = [c + v for c in "bcdfghjklmnprstvwyz" for v in "aeiou"]
    return list(dict.fromkeys("".join(rng.choices(syllables, k=rng.randint(1, 4)))
                              for _ in range(count)))  # fmt: skip


def corpus(seed: int, lines: int, kind: str = "prompt words") -> list[str]:
    """ASCII sentences over llmload's prompt words, or over made-up words (Zipf-weighted),
    plus numbers and punctuation."""
    from locustfiles.traffic.pieces import WORDS

    rng = random.Random(seed)
    words = list(dict.fromkeys(WORDS)) if kind == "prompt words" else made_up_words(rng)
    weights = [1.0 / (i + 10) for i in range(len(words))]
    out = []
    for _ in range(lines):
        n = rng.randint(4, 24)
        parts = rng.choices(words, weights, k=n)
        for i in range(n):
            r = rng.random()
            if r < 0.05:
                parts[i] = str(rng.randint(0, 9999))
            elif r < 0.10:
                parts[i] += rng.choice([",", ";", ":"])
            elif r < 0.12:
                parts[i] = parts[i].capitalize()
        out.append(" ".join(parts) + rng.choice([".", ".", ".", "?", "!"]))
    return out


def train_tokenizer(recipe: dict[str, Any]) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` whose alphabet is the corpus's ASCII characters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe["vocab_size"],
        special_tokens=[SPECIAL],
        # only characters seen in the corpus (ASCII, no stray bytes), and JSON's punctuation
        # for --think: a grammar of JSON needs its braces and quotes
        initial_alphabet=recipe.get("alphabet", []),
        show_progress=False,
    )
    lines = corpus(recipe["seed"], recipe["corpus_lines"], recipe.get("corpus", "prompt words"))
    tok.train_from_iterator(lines, trainer)
    if recipe.get("added_tokens"):
        from tokenizers import AddedToken

        tok.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t in recipe["added_tokens"]])  # fmt: skip
    return tok


def tokenizer_checks(tok: Any) -> dict[str, int]:
    """How many prompt words are one token, and how many tokens re-encode to themselves."""
    from locustfiles.traffic.pieces import WORDS

    words = list(dict.fromkeys(WORDS))
    single = sum(len(tok.encode(" " + w, add_special_tokens=False).ids) == 1 for w in words)
    special = tok.token_to_id(SPECIAL)
    roundtrip_failures = 0
    for i in range(tok.get_vocab_size()):
        if i == special:
            continue
        text = tok.decode([i])
        if tok.encode(text, add_special_tokens=False).ids != [i]:
            roundtrip_failures += 1
    return {
        "vocab_size": tok.get_vocab_size(),
        "prompt_words": len(words),
        "single_token_prompt_words": single,
        "roundtrip_failures": roundtrip_failures,
    }


def recipe_for(
    no_eos: bool = False, small_vocab: bool = False, head_dim_64: bool = False,
    think: bool = False,
) -> dict[str, Any]:  # fmt: skip
    return {
        **RECIPE,
        "no_eos": no_eos,
        **(SMALL_VOCAB if small_vocab else {}),
        **(HEAD_DIM_64 if head_dim_64 else {}),
        **(THINK if think else {}),
    }


def _matches(out_dir: Path, recipe: dict[str, Any]) -> bool:
    try:
        marker = json.loads((out_dir / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return bool(marker.get("recipe") == recipe and (out_dir / "tokenizer.json").is_file())


def build(
    out_dir: str | os.PathLike[str],
    force: bool = False,
    no_eos: bool = False,
    small_vocab: bool = False,
    head_dim_64: bool = False,
    think: bool = False,
) -> Path:
    """Build the model directory at `out_dir`, or reuse it if it holds the same recipe."""
    out = Path(out_dir).resolve()
    recipe = recipe_for(no_eos, small_vocab, head_dim_64, think)
    if not force and _matches(out, recipe):
        return out
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise SystemExit(f"{out} exists and is not a tiny-llama directory; give an empty path")
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)

    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    tok = train_tokenizer(recipe)
    checks = tokenizer_checks(tok)
    special = tok.token_to_id(SPECIAL)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL,
        eos_token=SPECIAL,
        pad_token=SPECIAL,
        model_max_length=recipe["max_position_embeddings"],
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=recipe["hidden_size"],
        intermediate_size=recipe["intermediate_size"],
        num_hidden_layers=recipe["num_hidden_layers"],
        num_attention_heads=recipe["num_attention_heads"],
        num_key_value_heads=recipe["num_key_value_heads"],
        max_position_embeddings=recipe["max_position_embeddings"],
        bos_token_id=special,
        eos_token_id=special,
        pad_token_id=special,
        tie_word_embeddings=True,
    )
    torch.manual_seed(recipe["seed"])
    model = LlamaForCausalLM(config).eval()
    generation: dict[str, Any] = dict(recipe["generation"])
    if no_eos:
        generation["suppress_tokens"] = [special]
    model.generation_config = GenerationConfig(
        bos_token_id=special, eos_token_id=special, pad_token_id=special, **generation
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        hf_tok.save_pretrained(tmp)
        import transformers

        marker = {
            "recipe": recipe,
            "tokenizer": checks,
            "parameters": sum(p.numel() for p in model.parameters()),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.chmod(0o755)  # mkdtemp made it private
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.engines.tiny_llama",
        description="Build a tiny random-weight Llama with a local tokenizer (no hub).",
    )
    parser.add_argument("out_dir", help="directory to write (reused if built with this recipe)")
    parser.add_argument(
        "--no-eos", action="store_true", help="never emit EOS: every output reaches max_tokens"
    )
    parser.add_argument(
        "--small-vocab",
        action="store_true",
        help="a 400-token byte-level BPE trained on made-up words (few whole English words)",
    )
    parser.add_argument(
        "--head-dim-64",
        action="store_true",
        help="heads of 64 dimensions (hidden 128, 2 heads): what vLLM's CPU kernel takes",
    )
    parser.add_argument(
        "--think",
        action="store_true",
        help="add <think> and </think> tokens (a DeepSeek-R1-style reasoning parser's markers)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if it exists")
    args = parser.parse_args(argv)
    out = build(
        args.out_dir,
        force=args.force,
        no_eos=args.no_eos,
        small_vocab=args.small_vocab,
        head_dim_64=args.head_dim_64,
        think=args.think,
    )
    marker = json.loads((out / MARKER).read_text())
    print(f"{out} ({marker['parameters']} parameters, tokenizer {marker['tokenizer']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
