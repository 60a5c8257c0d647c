"""Before the first request: everything the options refer to is loaded or checked.

One path for every mode (docs/reliability.md, "Bad input"):

- headless (and `--autostart`): the master (or the local runner) runs `preflight()` at
  Locust's init event; a failure prints one line and exits with status 2, before any user
  starts;
- web UI: the same `preflight()` runs when the start form is submitted, on the form's
  values; a failure is shown in the form and the run does not start;
- workers check what is theirs (tokenizer and dataset on their host, the events store from
  their network) when the run starts; a worker that cannot start tells the master, which
  stops the run naming the worker and the cause, and exits non-zero.

What `preflight()` checks, in order: the tokenizer can build exact prompts and the local
spool folder is writable (in a process that sends requests); the target
answers (any HTTP response; `--wait-ready SECONDS` waits for one that is still starting);
the events store accepts the run's first object, its manifest. A store that fails later in
the run keeps the usual behaviour (parts wait in the spool, nothing lost).
"""

from __future__ import annotations

import time
from typing import Any

from analysis.errors import LlmloadError, UsageError
from analysis.storage import ObjectStore, open_store
from locustfiles.request.client import new_pool
from locustfiles.request.errors import root_cause
from locustfiles.request.tokenizer import TokenCounter, load_tokenizer
from locustfiles.run.manifest import ProbeRecord, RunManifest, write_manifest
from locustfiles.run.options import ChatOptions
from locustfiles.run.probe import new_probe_id, send_probe
from locustfiles.sink.checks import check_spool, store_reason
from locustfiles.traffic.prompts import PromptBuilder

WAIT_POLL_S = 0.5
"""How often a target that is still starting is asked again (`--wait-ready`)."""


def check_prompts(options: ChatOptions) -> TokenCounter | None:
    """Load the tokenizer (if any) and build a prompt with it: UsageError if it cannot."""
    if not options.tokenizer:
        return None
    counter = load_tokenizer(options.tokenizer)
    PromptBuilder(options.seed, counter, options.shared_prefix_tokens)  # raises if unusable
    return counter


def check_target(host: str, options: ChatOptions) -> ProbeRecord:
    """The target answers (any HTTP status) within --connect-timeout, or within --wait-ready.

    A GET of `/v1/models` with its own request id, like every probe; returned for the
    manifest's `probes` (purpose `preflight`).
    """
    if not host:
        raise UsageError(
            "no target: give --host URL (the server's base URL, e.g. http://127.0.0.1:8000)"
        )
    url = host.rstrip("/") + "/v1/models"
    request_id = new_probe_id()  # one id for every try: only the answered one is listed
    budget = options.wait_ready if options.wait_ready > 0 else options.connect_timeout
    deadline = time.monotonic() + budget
    pool = new_pool()
    try:
        while True:
            left = max(0.1, deadline - time.monotonic())
            sent = send_probe(pool, "preflight", "GET", url, api_key=options.api_key(),
                              timeout=min(options.connect_timeout, left),
                              request_id=request_id)  # fmt: skip
            error = sent.reply.error
            if error is None:
                return sent.record
            if options.wait_ready <= 0 or time.monotonic() + WAIT_POLL_S >= deadline:
                waited = f" in {budget:g} s (--wait-ready)" if options.wait_ready > 0 else ""
                raise UsageError(
                    f"target {host} did not answer{waited} ({root_cause(error)}); start the "
                    "server, fix --host, or give --wait-ready SECONDS for one still starting"
                ) from None
            time.sleep(WAIT_POLL_S)
    finally:
        pool.clear()


def write_first_manifest(options: ChatOptions, run_id: str, host: str) -> ObjectStore:
    """Write the run's manifest (status running): the store must accept it, or UsageError."""
    try:
        store = open_store(options.events_uri)
        write_manifest(store, RunManifest(run_id, config=options.config(), target={"url": host}))
    except UsageError:
        raise
    except (LlmloadError, OSError) as exc:
        raise UsageError(
            f"cannot write to the events store {options.events_uri} ({store_reason(exc)}); "
            "fix --events-uri, the store's endpoint or credentials, the bucket or the "
            "directory's permissions"
        ) from None
    return store


def preflight(
    options: ChatOptions, host: str, run_id: str, *, sends_requests: bool = True
) -> list[ProbeRecord]:
    """Everything the master checks before a run: raises UsageError naming the first problem.

    Returns the probes it sent (for the manifest). `sends_requests=False` on a master with
    workers: each worker loads the tokenizer and uses a spool folder on its own host, which
    may be the only one that has them (workers check both when the run starts)."""
    if sends_requests:
        check_prompts(options)
        check_spool(options)
    probe = check_target(host, options)
    write_first_manifest(options, run_id, host)
    return [probe]


def form_namespace(parsed: Any, form: Any) -> Any:
    """Locust's parsed options with the web UI form's values applied, as Locust applies them
    (each value converted to the type of the option's current value)."""
    import argparse

    values = dict(vars(parsed))
    for key, value in form.items():
        if key not in values or key in ("user_count", "spawn_rate", "run_time"):
            continue
        current = values[key]
        if isinstance(current, bool):
            values[key] = value == "true"
        elif current is None or isinstance(current, str):
            values[key] = value
        elif isinstance(current, int | float):
            try:
                values[key] = type(current)(value)
            except ValueError:
                raise UsageError(f"--{key.replace('_', '-')} {value!r} is not a number") from None
    return argparse.Namespace(**values)
