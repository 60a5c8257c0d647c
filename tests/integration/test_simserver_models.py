"""The simulator serving several model ids, each with its own cost (`--served-models`,
`--model-cost`, `--adapters`): listed, answered under their own id, slower where costlier,
an unknown id refused as ever (404), the model in the truth log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.kernel.errors import UsageError
from tests.support.sim import SimFactory, chat_body, request, stream_request

FLAGS = ("--served-models", "base,slow,lora", "--model-cost", "slow:3",
         "--adapters", "lora", "--adapter-overhead-ms", "20")  # fmt: skip


def _gaps_ms(stream) -> list[float]:  # type: ignore[no-untyped-def]
    times = stream.arrivals_ns
    return [(b - a) / 1e6 for a, b in zip(times[2:-3], times[3:-2], strict=True)]


def test_every_model_is_listed_answered_and_logged(sim_factory: SimFactory, tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    sim = sim_factory(*FLAGS, "--truth-log", str(truth))
    status, _, body = request(sim.port, "GET", "/v1/models")
    listed = json.loads(body)["data"]
    assert status == 200 and [m["id"] for m in listed] == ["base", "slow", "lora"]
    assert listed[2]["parent"] == "base" and "parent" not in listed[0]
    for name in ("base", "slow", "lora"):
        stream = stream_request(sim.port, chat_body(model=name, max_tokens=3),
                                headers={"X-Request-Id": f"req-{name}"})  # fmt: skip
        assert stream.status == 200 and stream.json_events()[0]["model"] == name
    status, _, body = request(sim.port, "POST", "/v1/chat/completions",
                              chat_body(model="nope", stream=False))  # fmt: skip
    assert status == 404 and "`nope` does not exist" in json.loads(body)["error"]["message"]
    sim.stop()
    models = {}
    for line in truth.read_text().splitlines():
        row = json.loads(line)
        models[row["request_id"]] = row.get("model")
    assert {k: v for k, v in models.items() if k.startswith("req-")} == {
        "req-base": "base", "req-slow": "slow", "req-lora": "lora"
    }  # fmt: skip


def test_a_costlier_model_and_an_adapter_take_longer(sim_factory: SimFactory) -> None:
    sim = sim_factory(*FLAGS, "--decode-base-ms", "5")
    body = {"max_tokens": 12, "ignore_eos": True}
    base = _gaps_ms(stream_request(sim.port, chat_body(model="base", **body)))
    slow = _gaps_ms(stream_request(sim.port, chat_body(model="slow", **body)))
    lora = _gaps_ms(stream_request(sim.port, chat_body(model="lora", **body)))
    mean = lambda gaps: sum(gaps) / len(gaps)  # noqa: E731
    assert mean(slow) == pytest.approx(3 * mean(base), rel=0.25)
    assert mean(lora) == pytest.approx(mean(base) + 20, rel=0.25)


@pytest.mark.parametrize(
    ("flags", "words"),
    [(("--model-cost", "other:2"), "not served"),
     (("--served-models", "a,b", "--adapters", "a"), "base model"),
     (("--served-models", "a,b", "--model-cost", "b:0"), "must be > 0"),
     (("--served-models", "a,a"), "distinct"),
     (("--served-models", "a", "--model-name", "b"), "not both")],
)  # fmt: skip
def test_bad_model_flags_are_refused(sim_factory: SimFactory, flags: tuple[str, ...],
                                     words: str) -> None:  # fmt: skip
    with pytest.raises(UsageError, match=words):
        sim_factory(*flags)


def test_llmload_check_refuses_a_mix_with_a_model_not_served(
    sim_factory: SimFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra.cli import main

    sim = sim_factory(*FLAGS)
    url = f"http://127.0.0.1:{sim.port}"
    assert main(["check", url, "--model", "base:0.5,nope:0.5"]) == 2
    err = capsys.readouterr().err
    assert f"--model 'nope' is not served by {url}: it serves 'base', 'slow', 'lora'" in err
