#!/usr/bin/env bash
# The request path against vLLM on a quiet machine (docs/metrics.md, "The request path"):
# vLLM (CPU build, the engine suite's tiny model) pinned to the first core, llmload to the
# last, spans joined live (--otlp-listen); one 20 s step per concurrency given, then each
# part's p50/p99, how many requests had a part below zero, and how many would have a
# negative tail as E2E - TTFT - decode (the definition before issue 36, with decode as now).
#
#     make test-engine      # once: builds .venv-engine and .venv-vllm
#     bash bench/bench_vllm_path.sh 1 8
#
# Needs nothing else running on the machine; writes under ${WORK:-/tmp/llmload-vllm-path}.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${WORK:-/tmp/llmload-vllm-path}
PORT=${PORT:-8011}
OTLP=${OTLP:-4319}
ENGINE_PY=${ENGINE_PY:-.venv-engine/bin/python}  # any Python with torch and transformers
VLLM_PY=${VLLM_PY:-.venv-vllm/bin/python}        # any Python with vLLM
FIRST=$(python3 -c 'import os; print(min(os.sched_getaffinity(0)))')
LAST=$(python3 -c 'import os; print(max(os.sched_getaffinity(0)))')
mkdir -p "$WORK"
[ -d "$WORK/model" ] || PYTHONPATH=$ROOT "$ENGINE_PY" -m infra.engines.tiny_llama "$WORK/model" --head-dim-64
PYTHONPATH=$ROOT taskset -c "$FIRST" "$VLLM_PY" -m infra.engines.vllm_serve "$WORK/model" \
    --port "$PORT" --max-num-seqs 8 --otlp-traces-endpoint "http://127.0.0.1:$OTLP/v1/traces" \
    --workdir "$WORK/vllm" >"$WORK/serve.log" 2>&1 &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true; sleep 3; pkill -f "port $PORT" 2>/dev/null || true' EXIT
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
MODEL=$(curl -sf "http://127.0.0.1:$PORT/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
for C in "$@"; do
    rm -rf "$WORK/runs-c$C" "$WORK/runs-c$C.spool"
    taskset -c "$LAST" .venv/bin/locust -f locustfiles/chat.py --headless --only-summary \
        --host "http://127.0.0.1:$PORT" --events-uri "$WORK/runs-c$C" --spool-dir "$WORK/runs-c$C.spool" \
        --model "$MODEL" --tokenizer "$WORK/model" --steps "$C" --step-duration 20 --step-warmup 2 \
        --cold-requests 0 --workload "D(64,64)" --otlp-listen "127.0.0.1:$OTLP" --otlp-linger 3 \
        >"$WORK/locust-c$C.log" 2>&1
    RUN=$(ls -d "$WORK/runs-c$C"/*/ | head -1)
    echo "== concurrency $C: $RUN (ms)"
    .venv/bin/llmload sql "$RUN" "SELECT count(*) AS n,
        round(quantile_cont(network_up_s, 0.5) * 1e3, 2) AS up_p50,
        round(quantile_cont(server_other_s, 0.5) * 1e3, 2) AS other_p50,
        round(quantile_cont(server_prefill_s, 0.5) * 1e3, 2) AS prefill_p50,
        round(quantile_cont(first_token_delivery_s, 0.5) * 1e3, 2) AS delivery_p50,
        round(quantile_cont(first_token_delivery_s, 0.99) * 1e3, 2) AS delivery_p99,
        round(quantile_cont(server_decode_s, 0.5) * 1e3, 2) AS decode_p50,
        round(quantile_cont(tail_s, 0.5) * 1e3, 2) AS tail_p50,
        round(min(tail_s) * 1e3, 2) AS tail_min,
        sum((least(network_up_s, server_other_s, first_token_delivery_s, tail_s) < 0)::int) AS negative,
        sum((e2e_s - ttft_s - server_decode_s < 0)::int) AS negative_as_e2e_ttft_decode
        FROM request_path WHERE status = 'ok' AND span"
done
