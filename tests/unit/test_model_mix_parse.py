"""--model: one model as always, or a weighted mix picked per request with a seeded RNG."""

from __future__ import annotations

import collections

import pytest

from analysis.kernel.errors import UsageError
from locustfiles.traffic.models import ModelMix, parse_model_mix


def test_one_model_is_a_mix_of_one() -> None:
    mix = parse_model_mix("meta-llama/Llama-3.1-8B")
    assert mix == ModelMix(("meta-llama/Llama-3.1-8B",), (1.0,))
    assert not mix.several and mix.first == "meta-llama/Llama-3.1-8B"
    assert mix.sampler(0).pick() == "meta-llama/Llama-3.1-8B"


def test_no_model_picks_none() -> None:
    mix = parse_model_mix("")
    assert mix.names == () and mix.first is None and mix.sampler(0).pick() is None


def test_a_colon_without_a_number_is_part_of_the_name() -> None:
    assert parse_model_mix("llama3:8b").names == ("llama3:8b",)
    assert parse_model_mix("llama3:8b:3,b:1").shares() == {"llama3:8b": 0.75, "b": 0.25}


def test_weights_are_normalised_and_a_bare_list_is_equal() -> None:
    assert parse_model_mix("a:7,b:3").shares() == pytest.approx({"a": 0.7, "b": 0.3})
    assert parse_model_mix(" a , b ").shares() == {"a": 0.5, "b": 0.5}


@pytest.mark.parametrize(
    ("text", "words"),
    [("a:0,b:1", "must be a number > 0"), ("a:-1", "must be a number > 0"),
     ("a,,b", "empty model name"), ("a,a:2", "twice"), (":1", "empty model name")],
)  # fmt: skip
def test_bad_mixes_are_refused(text: str, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        parse_model_mix(text)


def test_the_sampler_keeps_the_proportions_and_its_seed() -> None:
    mix = parse_model_mix("a:0.7,b:0.2,c:0.1")
    picks = [mix.sampler(7, 1).pick() for _ in range(1)]
    sampler = mix.sampler(7, 1)
    drawn = [sampler.pick() for _ in range(20_000)]
    counts = collections.Counter(drawn)
    for name, share in mix.shares().items():
        assert counts[name] / len(drawn) == pytest.approx(share, abs=0.015)
    again = mix.sampler(7, 1)
    assert [again.pick() for _ in range(200)] == drawn[:200]  # seeded: the same sequence
    other = mix.sampler(7, 2)
    assert [other.pick() for _ in range(200)] != drawn[:200]  # another worker, another one
    assert picks[0] == drawn[0]


def test_the_option_takes_a_mix_and_refuses_a_bad_one() -> None:
    from locustfiles.options.table import OPTION

    option = OPTION["model"]
    assert option.kind.value("a:0.7,b:0.3", option.cli()) == "a:0.7,b:0.3"
    assert option.kind.value("llama", option.cli()) == "llama"
    with pytest.raises(UsageError, match="--model"):
        option.kind.value("a:0", option.cli())
