"""A tokenizer's count of text: exact prompt lengths and per-event token counts.

`load_tokenizer` opens a local tokenizer directory or tokenizer.json (the `tokenizers`
package) or, where it is installed, a transformers tokenizer resolvable offline. The request
path counts tokens of streamed deltas with it (stream.py); traffic builds exact prompts of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from analysis.kernel.errors import UsageError


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
