"""Time analysis.derive.metrics.compute_request_metrics on synthetic data.

Default: 1,000,000 requests and 10,000,000 chunk rows (10 chunks of 1-3 tokens each), with
request ids as a categorical column, the way analysis reads them from Parquet. Prints rows/s
and the process's peak resident memory.

    .venv/bin/python bench/bench_metrics.py [--requests N] [--chunks-per-request K]
"""

from __future__ import annotations

import argparse
import platform
import resource
import time

import numpy as np
import pandas as pd

from analysis.derive.metrics import compute_request_metrics


def synthetic(
    n_requests: int, per_request: int, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    ids = np.array([f"{i:032x}" for i in range(n_requests)], dtype=object)
    n_chunks = n_requests * per_request
    gaps = rng.integers(1_000_000, 50_000_000, size=n_chunks)  # 1-50 ms between chunks
    first = rng.integers(10_000_000, 500_000_000, size=n_requests)  # TTFT 10-500 ms
    gaps.reshape(n_requests, per_request)[:, 0] = first
    offsets = np.cumsum(gaps.reshape(n_requests, per_request), axis=1).ravel()
    tokens = rng.integers(1, 4, size=n_chunks).astype(np.int32)
    per_req_tokens = tokens.reshape(n_requests, per_request).sum(axis=1)
    last = offsets.reshape(n_requests, per_request)[:, -1]
    requests = pd.DataFrame(
        {
            "request_id": ids,
            "headers_ns": first // 2,
            "first_event_ns": first,
            "first_token_ns": first,
            "first_content_ns": first,
            "last_token_ns": last,
            "end_ns": last + 1_000_000,
            "output_tokens": per_req_tokens,
        }
    )
    order = rng.permutation(n_chunks)  # parts interleave requests: nothing arrives sorted
    chunks = pd.DataFrame(
        {
            "request_id": pd.Categorical.from_codes(
                np.repeat(np.arange(n_requests), per_request)[order], categories=ids
            ),
            "seq": np.tile(np.arange(per_request, dtype=np.int32), n_requests)[order],
            "offset_ns": offsets[order],
            "tokens": tokens[order],
        }
    )
    return requests, chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--chunks-per-request", type=int, default=10)
    args = parser.parse_args()
    requests, chunks = synthetic(args.requests, args.chunks_per_request)
    data_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    result = compute_request_metrics(requests, chunks)
    elapsed = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"machine: {platform.node()} {platform.machine()} python {platform.python_version()}")
    print(f"requests: {len(requests):,}  chunk rows: {len(chunks):,}")
    print(f"compute_request_metrics: {elapsed:.2f} s")
    print(f"  {len(requests) / elapsed:,.0f} requests/s, {len(chunks) / elapsed:,.0f} chunk rows/s")
    print(f"  ITL samples: {len(result.itl):,} (weights sum {result.itl.weight.sum():,.0f})")
    print(f"peak RSS: {data_mib:,.0f} MiB after generating the data, {peak_mib:,.0f} MiB after")


if __name__ == "__main__":
    main()
