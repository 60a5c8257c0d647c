"""Prefix groups (--prefix-groups, --prefix-tokens), --cache-phase options, the implied
cached share, and the simulator's flush of its prefix cache."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from analysis.derive.cachestate import PrefixPlan, cache_columns, cache_warnings
from analysis.kernel.errors import UsageError
from infra.simserver.prefix_cache import PrefixCache, block_keys
from locustfiles.options.options import from_parsed
from locustfiles.traffic.prompts import PromptBuilder
from tests.support.options import parsed_options as defaults


def test_prefix_groups_parse_and_shared_prefix_is_one_group() -> None:
    opts = from_parsed(defaults(prefix_groups=4, prefix_tokens=256, cache_phase="flush+prime"))
    assert (opts.prefix_groups, opts.prefix_tokens, opts.cache_phase) == (4, 256, "flush+prime")
    assert opts.engine_block_size == 16
    one = from_parsed(defaults(shared_prefix_tokens=40))
    assert (one.prefix_groups, one.prefix_tokens) == (1, 40)
    plain = from_parsed(defaults())
    assert (plain.prefix_groups, plain.prefix_tokens, plain.cache_phase) == (0, 0, "none")
    config = opts.config()
    assert config["prefix_groups"] == 4 and config["cache_phase"] == "flush+prime"


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"prefix_groups": 4}, "--prefix-tokens is needed with --prefix-groups"),
     ({"prefix_tokens": 64}, "--prefix-groups is needed with --prefix-tokens"),
     ({"prefix_groups": 2, "prefix_tokens": 64, "shared_prefix_tokens": 64}, "not both"),
     ({"cache_phase": "prime"}, "primes the shared prefixes"),
     ({"cache_phase": "flush+prime"}, "primes the shared prefixes"),
     ({"cache_phase": "later"}, "--cache-phase must be"),
     ({"prefix_groups": -1}, "--prefix-groups must be an integer >= 0"),
     ({"engine_block_size": 0}, "--engine-block-size must be an integer >= 1")],
)  # fmt: skip
def test_invalid_prefix_options_are_one_clear_error(changes: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        from_parsed(defaults(**changes))


def test_flush_alone_needs_no_prefixes() -> None:
    assert from_parsed(defaults(cache_phase="flush")).cache_phase == "flush"


def test_each_prompt_starts_with_one_of_the_groups_prefixes() -> None:
    builder = PromptBuilder(3, None, 64, 4)
    prefixes = [builder.prime_text(g, 0, random.Random(0)) for g in range(4)]
    assert all(len(p.split()) == 64 for p in prefixes)
    # alike but for the anchor: no two share their first block of 16 words
    assert len({tuple(p.split()[:16]) for p in prefixes}) == 4
    assert len({p.split()[0] for p in prefixes}) == 1
    rng = random.Random(5)
    seen = []
    for _ in range(200):
        text = builder.text(100, rng)
        assert len(text.split()) == 100
        seen.append(next(g for g, p in enumerate(prefixes) if text.startswith(p)))
    assert set(seen) == {0, 1, 2, 3}
    # seeded: the same generator picks the same groups; another seed, other prefixes
    again = PromptBuilder(3, None, 64, 4)
    assert [again.text(100, random.Random(9))] == [builder.text(100, random.Random(9))]
    assert PromptBuilder(4, None, 64, 4).prime_text(0, 0, random.Random(0)) != prefixes[0]


def test_one_group_keeps_the_shared_prefix_prompts() -> None:
    """--shared-prefix-tokens N is --prefix-groups 1: the same prompts as before groups."""
    builder = PromptBuilder(7, None, 40)
    assert builder.prefixes == [builder.shared_prefix]
    texts = [builder.text(n, random.Random(1)) for n in (40, 100)]
    assert texts[0] == "".join(builder.shared_prefix)
    assert texts[1].startswith(texts[0])


def test_calibration_probes_carry_no_group_prefix() -> None:
    builder = PromptBuilder(3, None, 64, 4)
    sent: list[str] = []
    builder.calibrate(lambda text: sent.append(text) or len(text.split()))
    prefixes = [builder.prime_text(g, 0, random.Random(0)) for g in range(4)]
    assert len(sent) == 2
    assert not any(t.startswith(p[: len(p) // 4]) for t in sent for p in prefixes)


def test_the_simulators_cache_empties_on_reset() -> None:
    cache = PrefixCache(16, 1024)
    keys = block_keys(list(range(64)), 16)
    cache.insert(keys)
    assert cache.match(keys, 65) == 64
    cache.reset()
    assert cache.match(keys, 65) == 0 and cache.resets == 1 and cache.cached_blocks == 0


def _requests(prompt: list[float], cached: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"prompt_tokens": prompt, "cached_tokens": cached})


def test_the_implied_share_counts_the_prefixes_full_blocks() -> None:
    manifest = {"config": {"prefix_groups": 4, "prefix_tokens": 250, "engine_block_size": 16,
                           "workload": "D(400,4)"}}  # fmt: skip
    plan = PrefixPlan.of(manifest)
    assert plan == PrefixPlan(4, 250, 16)
    # 250 -> 15 full blocks = 240; a prompt of 100 tokens: (100-1)//16 = 6 blocks = 96
    assert plan.implied_tokens(np.array([400.0, 100.0])).tolist() == [240.0, 96.0]
    req = _requests([400, 100, 400], [240, 96, np.nan])
    rows = np.array([True, True, True])
    entry = {"cache_phase": {"phase": "flush+prime", "flush": "ok", "primed": 4}}
    cols = cache_columns(plan, req, rows, entry)
    assert cols["cached_implied_pct"] == pytest.approx(100 * 336 / 500)  # the rows with both
    assert (cols["cache_phase"], cols["cache_flush"], cols["cache_primed"]) == (
        "flush+prime",
        "ok",
        4,
    )
    none = cache_columns(None, req, rows, None)
    assert np.isnan(none["cached_implied_pct"]) and none["cache_phase"] is None
    assert PrefixPlan.of({"config": {"shared_prefix_tokens": 32}}) == PrefixPlan(1, 32, 16)
    assert PrefixPlan.of({"config": {"workload": "dataset:x.jsonl", "prefix_groups": 2,
                                     "prefix_tokens": 64}}) is None  # fmt: skip


def test_warnings_name_a_refused_flush_and_a_share_far_from_implied() -> None:
    entry = {"cache_phase": {"phase": "flush", "flush": "refused",
                             "flush_detail": "POST /reset_prefix_cache: http 404"}}  # fmt: skip
    row = {"cached_implied_pct": 60.0, "cached_tokens_pct": 20.0}
    said = cache_warnings("step 0", row, entry)
    assert len(said) == 2
    assert "VLLM_SERVER_DEV_MODE=1" in said[0] and "http 404" in said[0]
    assert "20.0%" in said[1] and "60.0%" in said[1]
    assert (
        cache_warnings("step 0", {"cached_implied_pct": 60.0, "cached_tokens_pct": 57.0}, None)
        == []
    )


def test_the_cache_phase_runs_before_each_step_not_the_cold_phase() -> None:
    from locustfiles.master.staircase import Staircase

    calls: list[int] = []
    announced: list[tuple] = []

    def before(step: int) -> dict:
        calls.append(step)
        return {"phase": "flush", "flush": "ok"}

    staircase = Staircase(
        (2, 4), 0.0, 0.0, 1, announce=lambda *a: announced.append(a),
        finished_requests=lambda: 1, before_step=before,
    )  # fmt: skip
    staircase.tick()  # the cold phase: no cache phase
    assert calls == [] and announced[-1][2] is True
    staircase.tick()  # step 0
    staircase.on_spawned(2)
    staircase.tick()  # step 1
    assert calls == [0, 1]
    assert [e["cache_phase"]["flush"] for e in staircase.timeline] == ["ok", "ok"]
