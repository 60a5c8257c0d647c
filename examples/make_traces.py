"""Write the small example traces in examples/traces/ (seeded: the same files every time).

    .venv/bin/python examples/make_traces.py [OUT_DIR]

- `mooncake.jsonl`: 1,000 requests over about 230 s in Mooncake's format (`timestamp` ms,
  `input_length`, `output_length`, `hash_ids` of 512-token blocks). Requests come from a
  few dozen "sessions": each session has a system prompt of 1-3 blocks shared with the
  other sessions of its app, and each turn resends the session's earlier blocks plus new
  ones, so leading hash ids repeat the way a prefix cache sees them in production.
- `azure.csv`: 200 requests in the Azure LLM inference trace's columns (`TIMESTAMP`,
  `ContextTokens`, `GeneratedTokens`).
- `burstgpt.csv`: 200 requests in BurstGPT's columns (`Timestamp`, `Model`,
  `Request tokens`, `Response tokens`, `Total tokens`, `Log Type`), a few failed requests
  (0 response tokens) among them, as in the real log.

Every prompt plus output stays under 4,096 tokens, so the traces replay on the simulator's
`tiny` profile (docs/workloads.md#trace-replay).
"""

from __future__ import annotations

import csv
import json
import random
import sys
from datetime import datetime, timedelta
from pathlib import Path

BLOCK = 512


def mooncake(rng: random.Random, n: int = 1000) -> list[dict[str, object]]:
    next_id = 0

    def new_ids(k: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + k))
        next_id += k
        return ids

    apps = [new_ids(rng.randint(1, 3)) for _ in range(4)]  # system prompts
    sessions: list[list[int]] = []
    rows = []
    t_ms = 0.0
    for _ in range(n):
        t_ms += rng.expovariate(1 / 300.0) * (0.2 if rng.random() < 0.3 else 1.0)  # bursts
        if sessions and rng.random() < 0.6:
            ids = rng.choice(sessions)  # a later turn: the session so far, then a new block
            if len(ids) < 6:
                ids.extend(new_ids(1))
        else:  # a new session of an app
            ids = list(rng.choice(apps)) + new_ids(1)
            sessions.append(ids)
        length = (len(ids) - 1) * BLOCK + rng.randint(1, BLOCK)  # its last block is partial
        rows.append({"timestamp": int(t_ms), "input_length": length,
                     "output_length": rng.randint(8, 256), "hash_ids": list(ids)})  # fmt: skip
    return rows


def azure(rng: random.Random, n: int = 200) -> list[list[object]]:
    t = datetime(2023, 11, 16, 18, 15, 46)
    rows: list[list[object]] = []
    for _ in range(n):
        t += timedelta(seconds=rng.expovariate(2.0))
        stamp = t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond * 10:07d}"
        rows.append([stamp, int(rng.lognormvariate(6.5, 0.8)) % 3500 + 1, rng.randint(1, 400)])
    return rows


def burstgpt(rng: random.Random, n: int = 200) -> list[list[object]]:
    rows: list[list[object]] = []
    t = 0
    for _ in range(n):
        t += int(rng.expovariate(0.5))
        request = int(rng.lognormvariate(6.0, 1.0)) % 3500 + 1
        response = 0 if rng.random() < 0.03 else rng.randint(1, 500)
        model = rng.choice(("ChatGPT", "GPT-4"))
        log = rng.choice(("Conversation log", "API log"))
        rows.append([t, model, request, response, request + response, log])
    return rows


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = mooncake(random.Random("llmload-example-mooncake"))
    with (out / "mooncake.jsonl").open("w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row, separators=(", ", ": ")) + "\n" for row in rows)
    with (out / "azure.csv").open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        writer.writerows(azure(random.Random("llmload-example-azure")))
    with (out / "burstgpt.csv").open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["Timestamp", "Model", "Request tokens", "Response tokens",
                         "Total tokens", "Log Type"])  # fmt: skip
        writer.writerows(burstgpt(random.Random("llmload-example-burstgpt")))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "traces")
