"""Which model each request asks for: `--model NAME`, or a weighted mix of several.

    parse_model_mix("llama")            # one model, every request (as it always was)
    parse_model_mix("a:0.7,b:0.3")      # a weighted mix, normalised (0.7, 0.3)
    parse_model_mix("base,base-lora")   # no weights: equal shares
    mix.sampler(seed, worker_index).pick()   # one model per request, seeded

A name is a base model or a LoRA adapter's name, as the server lists it in /v1/models. A
weight follows the name's last `:` and must be a number > 0; a name whose last `:` is not
followed by a number is a name with a colon (`llama3:8b`). Empty: no model named (the
first id the server lists). Picks are reproducible: the same seed and worker index give the
same sequence of models.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

from analysis.kernel.errors import UsageError

_EXAMPLE = "--model a:0.7,b:0.3"


@dataclass(frozen=True)
class ModelMix:
    """Model names and their shares (normalised, summing to 1); none: the server's first."""

    names: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()

    @property
    def several(self) -> bool:
        return len(self.names) > 1

    @property
    def first(self) -> str | None:
        return self.names[0] if self.names else None

    def shares(self) -> dict[str, float]:
        """What the manifest records: each name's share of the requests."""
        return dict(zip(self.names, self.weights, strict=True))

    def sampler(self, seed: int, stream: int = 0) -> ModelSampler:
        return ModelSampler(self, random.Random(f"llmload-models:{seed}:{stream}"))


class ModelSampler:
    """Picks one model per request from a mix, with its own seeded RNG."""

    def __init__(self, mix: ModelMix, rng: random.Random) -> None:
        self.mix = mix
        self.rng = rng
        self._bounds = list(accumulate(mix.weights))

    def pick(self) -> str | None:
        names = self.mix.names
        if len(names) <= 1:  # one model (or none): no draw, the RNG is left untouched
            return names[0] if names else None
        index = bisect_right(self._bounds, self.rng.random() * self._bounds[-1])
        return names[min(index, len(names) - 1)]


def _weight(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value


def parse_model_mix(text: str) -> ModelMix:
    """--model: empty, one name, or `name[:weight],...`; UsageError names the fault."""
    text = text.strip()
    if not text:
        return ModelMix()
    names: list[str] = []
    weights: list[float] = []
    for item in text.split(","):
        item = item.strip()
        name, sep, tail = item.rpartition(":")
        weight = _weight(tail) if sep else None
        if weight is None:
            name, weight = item, 1.0
        name = name.strip()
        if not name:
            raise UsageError(f"--model {text!r}: an empty model name; e.g. {_EXAMPLE}")
        if not (math.isfinite(weight) and weight > 0):
            raise UsageError(
                f"--model {text!r}: the weight of {name!r} must be a number > 0, not {tail!r}; "
                f"e.g. {_EXAMPLE}"
            )
        if name in names:
            raise UsageError(f"--model {text!r} names {name!r} twice; give each model once")
        names.append(name)
        weights.append(weight)
    total = sum(weights)
    return ModelMix(tuple(names), tuple(w / total for w in weights))


def check_model_mix(text: str) -> str:
    """--model's check: the text as given, when it parses."""
    parse_model_mix(text)
    return text
