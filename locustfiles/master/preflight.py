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
spool folder is writable (in a process that sends requests); `--report-dir` takes files
(the master writes the report there); no run of this id is in the
events store (a run id names one run); `--host` is a base URL
without a path or query (options/parsers.py); the target
answers (any HTTP response; `--wait-ready SECONDS` waits for one that is still starting);
a `--model` the server's `/v1/models` does not list is one it accepts (`check_model`);
a request of the run's shape is not refused (`check_first_request`: a 401, a 404, a 400 on
what --extra-body adds would refuse every request of the run);
the events store accepts the run's first object, its manifest. A store that fails later in
the run keeps the usual behaviour (parts wait in the spool, nothing lost).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analysis.kernel.errors import LlmloadError, UsageError
from analysis.kernel.storage import ObjectExistsError, ObjectStore, open_store
from locustfiles.options.options import ChatOptions
from locustfiles.options.parsers import check_host
from locustfiles.request.client import Limits, execute, new_pool
from locustfiles.request.errors import describe, no_completion, refused_status, root_cause
from locustfiles.request.record import RequestRecord
from locustfiles.request.tokenizer import TokenCounter, load_tokenizer
from locustfiles.run.body import request_body
from locustfiles.run.manifest import ProbeRecord, RunManifest, run_taken, write_manifest
from locustfiles.run.probe import (
    PROBE_TIMEOUT_S,
    SentProbe,
    new_probe_id,
    probe_headers,
    record_outcome,
    send_probe,
    send_stream_probe,
    served_models,
)
from locustfiles.run.secrets import redact, run_secrets
from locustfiles.run.service import Ask, HookFailed, Service, prepare
from locustfiles.sink.checks import check_spool, check_takes_files, store_reason
from locustfiles.sink.eventsink import default_spool_dir
from locustfiles.traffic.prompts import PromptBuilder

WAIT_POLL_S = 0.5
"""How often a target that is still starting is asked again (`--wait-ready`)."""


def check_prompts(options: ChatOptions) -> TokenCounter | None:
    """Load the tokenizer (if any) and build a prompt with it: UsageError if it cannot."""
    if not options.tokenizer:
        return None
    counter = load_tokenizer(options.tokenizer)
    PromptBuilder(
        options.seed, counter, options.prefix_tokens, options.prefix_groups
    )  # raises if unusable
    return counter


def check_target(host: str, options: ChatOptions) -> SentProbe:
    """The target answers (any HTTP status) within --connect-timeout, or within --wait-ready.

    A GET of `/v1/models` with its own request id, like every probe; its record goes to the
    manifest's `probes` (purpose `preflight`), its reply to `check_model`.
    """
    if not host:
        raise UsageError(
            "no target: give --host URL (the server's base URL, e.g. http://127.0.0.1:8000)"
        )
    url = check_host(host, options.path) + "/v1/models"
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
                return sent
            if options.wait_ready <= 0 or time.monotonic() + WAIT_POLL_S >= deadline:
                waited = f" in {budget:g} s (--wait-ready)" if options.wait_ready > 0 else ""
                raise UsageError(
                    f"target {host} did not answer{waited} ({root_cause(error)}); start the "
                    "server, fix --host, or give --wait-ready SECONDS for one still starting"
                ) from None
            time.sleep(WAIT_POLL_S)
    finally:
        pool.clear()


def unknown_model(model: str, served: list[str], host: str, flag: str = "--model") -> str:
    """The one line that refuses a model the server does not serve, naming those it does."""
    listed = ", ".join(repr(m) for m in served[:10]) + (", ..." if len(served) > 10 else "")
    return (
        f"{flag} {model!r} is not served by {host}: it serves {listed}; give one of them "
        f"(e.g. {flag} {served[0]}) or leave {flag} out for the first"
    )


def check_model(host: str, options: ChatOptions, models: SentProbe) -> list[ProbeRecord]:
    """A `--model` that `/v1/models` answered without listing is refused (UsageError naming
    the models served) when a one-token request for it is refused too (4xx): some servers list
    other names than they accept (transformers serve lists its hub cache, llama.cpp accepts
    any name). A mix (`a:0.7,b:0.3`) is checked model by model; the first refused is named.
    Returns the probes it sent, if any, for the manifest."""
    served = served_models(models.reply.json()) if models.reply.status == 200 else []
    unlisted = [name for name in options.model_mix.names if name not in served]
    if not served or not unlisted:
        return []
    sent_probes: list[ProbeRecord] = []
    bare = dataclasses.replace(options, extra_body={})  # the model alone is asked about
    pool = new_pool()
    try:
        for name in unlisted:
            body = request_body(bare, name, "hi", None, 1, stream=False, continuous_usage=False,
                                ignore_eos=False)  # fmt: skip
            sent = send_probe(pool, "model", "POST", host.rstrip("/") + options.path, body=body,
                              api_key=options.api_key(),
                              timeout=min(options.request_timeout, PROBE_TIMEOUT_S))  # fmt: skip
            sent_probes.append(sent.record)
            if refused_status(sent.reply.status):
                raise UsageError(unknown_model(name, served, host))
    finally:
        pool.clear()
    return sent_probes


def first_request_fix(status: int | None, options: ChatOptions) -> str:
    """What to change when the server refused the run's first request with `status`."""
    if status in (401, 403):
        return ("give the API key the server expects: --api-key-env NAME names the environment "
                "variable that holds it (on every worker's host too)")  # fmt: skip
    if status in (404, 405):
        return (f"the server has no POST {options.path}: check --endpoint (chat, completions, "
                "responses or messages) and that --host is the server's base URL")  # fmt: skip
    return ("fix what the server names (--extra-body, --model, --continuous-usage, "
            "--ignore-eos) or the server's settings")  # fmt: skip


def first_request_limits(options: ChatOptions) -> Limits:
    """The run's timeouts for its first request, each at most PROBE_TIMEOUT_S; every read
    bounded by it too (the preflight runs without the watchdog's greenlet)."""
    bound = min(options.request_timeout, PROBE_TIMEOUT_S)
    return Limits(connect_timeout=options.connect_timeout, request_timeout=bound,
                  ttft_timeout=options.ttft_timeout or None,
                  stall_timeout=options.stall_timeout or None, read_timeout=bound,
                  max_event_bytes=options.max_event_bytes)  # fmt: skip


def check_first_request(host: str, options: ChatOptions, models: SentProbe) -> ProbeRecord:
    """One request of the run's shape (the model, streamed or not, stream options and
    --extra-body as every request of the run; a short prompt, one token), bounded by the
    run's timeouts and PROBE_TIMEOUT_S. Refused as such (4xx but 408/429): every request of
    the run would be, so UsageError with the server's message, before any load. Any other
    outcome (answered, 5xx, timeout) lets the run start: a server still warming up is the
    run's to measure. Returns its probe record (purpose `first_request`), for the manifest."""
    served = served_models(models.reply.json()) if models.reply.status == 200 else []
    model = options.model_mix.first or (served[0] if served else None)
    body = request_body(options, model, "hi", None, 1, stream=options.stream,
                        continuous_usage=options.continuous_usage == "on",
                        ignore_eos=False)  # fmt: skip
    limits = first_request_limits(options)
    secrets = run_secrets(options.api_key_env)
    pool = new_pool()
    try:
        record, probe = send_stream_probe(pool, "first_request", host.rstrip("/") + options.path,
                                          body, limits, endpoint=options.endpoint, model=model,
                                          api_key=options.api_key(), secrets=secrets)  # fmt: skip
    finally:
        pool.clear()
    if refused_status(record.http_status):
        detail = redact(record.error_detail or f"HTTP {record.http_status}", secrets)
        raise UsageError(
            f"the target {host} refused this run's first request ({detail}); every request "
            f"would be refused the same way: {first_request_fix(record.http_status, options)}"
        )
    if no_completion(record):
        detail = redact(record.error_detail or record.error_kind or "", secrets)
        raise UsageError(
            f"the target {host} answered this run's first request with HTTP 200 but no "
            f"completion ({detail}); every request would be answered the same way: is "
            f"{host}{options.path} an OpenAI-compatible endpoint? Check --host (the server's "
            "root URL, without /v1) and --endpoint"
        )
    return probe


def run_exists(options: ChatOptions, run_id: str) -> UsageError:
    """The one line that refuses a run id another run already holds in the events store."""
    return UsageError(
        f"run {run_id} already exists in the events store {options.events_uri}; a run id "
        "names one run: choose another --run-id, or leave --run-id out for a generated one"
    )


def run_id_taken(options: ChatOptions) -> Callable[[str], bool]:
    """Whether the events store holds a run of an id; False where the store cannot say (the
    manifest's create-only write then reports the store, or refuses the id)."""

    def taken(run_id: str) -> bool:
        try:
            return run_taken(open_store(options.events_uri), run_id)
        except (LlmloadError, OSError):
            return False

    return taken


def check_report_dir(options: ChatOptions) -> None:
    """--report-dir (the master writes the report there at the end) takes files: refused
    now, not after the run. Empty: the web UI's temporary folder, headless none."""
    if not options.report_dir:
        return
    try:
        check_takes_files(Path(options.report_dir))
    except OSError as exc:
        raise UsageError(
            f"cannot write the report to --report-dir {options.report_dir} "
            f"({store_reason(exc)}); fix --report-dir (a writable local folder) or its "
            "permissions"
        ) from None


def check_run_id(options: ChatOptions, run_id: str, *, local_spool: bool = False) -> None:
    """No run of this id is in the events store yet (before any request): or UsageError.

    `local_spool`: this process sends the requests, so its spool folder must not hold parts of
    a run of this id either (a run whose upload never finished: they would be mixed)."""
    if run_id_taken(options)(run_id):
        raise run_exists(options, run_id)
    if local_spool:
        root = Path(options.spool_dir) if options.spool_dir else default_spool_dir()
        if any(path.is_file() for path in (root / run_id).rglob("*")):
            raise UsageError(
                f"run {run_id} already has events waiting in the spool folder {root / run_id} "
                "(a run of this id whose upload did not finish); a run id names one run: "
                f"upload them (llmload upload-spool {root} --events-uri {options.events_uri}) "
                "or choose another --run-id"
            )


def write_first_manifest(options: ChatOptions, run_id: str, host: str) -> ObjectStore:
    """Create the run's manifest (status running): the store must accept it, or UsageError.

    A create-only put: an id another run took since `check_run_id` is refused, not replaced."""
    try:
        store = open_store(options.events_uri)
        write_manifest(store, RunManifest(run_id, config=options.config(), target={"url": host}))
    except UsageError:
        raise
    except ObjectExistsError:
        raise run_exists(options, run_id) from None
    except (LlmloadError, OSError) as exc:
        raise UsageError(
            f"cannot write to the events store {options.events_uri} ({store_reason(exc)}); "
            "fix --events-uri, the store's endpoint or credentials, the bucket or the "
            "directory's permissions"
        ) from None
    return store


def preflight(
    options: ChatOptions,
    host: str,
    run_id: str,
    *,
    sends_requests: bool = True,
    service: Service | None = None,
) -> list[ProbeRecord]:
    """Everything the master checks before a run: raises UsageError naming the first problem.

    Returns the probes it sent (for the manifest). `sends_requests=False` on a master with
    workers: each worker loads the tokenizer and uses a spool folder on its own host, which
    may be the only one that has them (workers check both when the run starts). `service`:
    a user's own service (run/service.py): its first request goes by its hooks, and the
    OpenAI model check does not apply."""
    if sends_requests:
        check_prompts(options)
        check_spool(options)
    check_report_dir(options)
    check_run_id(options, run_id, local_spool=sends_requests)
    models = check_target(host, options)
    if service is not None:
        probes = [models.record, check_service_request(host, options, service)]
    else:
        probes = [models.record, *check_model(host, options, models)]
        probes.append(check_first_request(host, options, models))
    write_first_manifest(options, run_id, host)
    return probes


def check_service_request(host: str, options: ChatOptions, service: Service) -> ProbeRecord:
    """The run's first request by a service's own hooks (login, build_request, its stream
    adapter), as `check_first_request` judges the built-in one: a hook that raises, or a
    request refused as such (4xx but 408/429) or answered with no completion, is refused with
    the hook or the server's answer named."""
    owner = type(service).__name__
    limits = first_request_limits(options)
    secrets = run_secrets(options.api_key_env)
    rid = new_probe_id()
    record = RequestRecord(rid, -1, 1, False, "probe", service.endpoint_name() or options.endpoint,
                           options.model_mix.first, options.stream, None, 1, "")  # fmt: skip
    pool = new_pool()
    try:
        ask = Ask(rid, "hi", None, 1, options.model_mix.first, options.stream, "probe", 1)
        try:
            request, adapter = prepare(service, pool, host, limits.read_timeout or PROBE_TIMEOUT_S,
                                       ask)  # fmt: skip
        except HookFailed as failed:
            raise UsageError(
                f"{failed} failed before the run's first request "
                f"({redact(describe(failed.error), secrets)}): fix the hook (docs/extending.md)"
            ) from None
        headers = {**probe_headers(rid, options.api_key()), **request.headers}
        execute(pool, request.url(host), request.body, headers, record, limits, adapter=adapter)
    finally:
        pool.clear()
    outcome = redact(record_outcome(record), secrets)
    probe = ProbeRecord(rid, "first_request", record.http_status, outcome, None)
    detail = redact(record.error_detail or f"HTTP {record.http_status}", secrets)
    if refused_status(record.http_status):
        raise UsageError(
            f"the target {host} refused this run's first request by {owner} ({detail}); every "
            f"request would be refused the same way: fix {owner}.build_request or the target"
        )
    if no_completion(record):
        raise UsageError(
            f"{owner}'s first request was answered with no completion as its stream adapter "
            f"reads it ({detail}): fix {owner}.stream_adapter or {owner}.build_request"
        )
    return probe


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
