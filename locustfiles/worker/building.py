"""What a worker sends next: the request spec, its prompt text and the record it starts.

One RequestBuilder per WorkerContext: the seeded workload streams (this worker's share of
the run's seed), the prompt builder and the tokenizer. A session's turns
(`locustfiles/traffic/sessions.py`) draw from the same streams.
"""

from __future__ import annotations

import json
import random

from locustfiles.options.options import ChatOptions
from locustfiles.request.record import RequestRecord, new_request_id
from locustfiles.request.tokenizer import TokenCounter, load_tokenizer
from locustfiles.run.protocol import StepState
from locustfiles.traffic.prompts import PromptBuilder, prompt_hash
from locustfiles.traffic.sessions import Turn
from locustfiles.traffic.workloads import RequestSpec
from locustfiles.worker.openloop import Arrival


class RequestBuilder:
    """Specs, prompts and fresh records for one worker's requests."""

    def __init__(self, options: ChatOptions, worker_index: int) -> None:
        self.options = options
        self.counter: TokenCounter | None = (
            load_tokenizer(options.tokenizer) if options.tokenizer else None
        )
        self.prompts = PromptBuilder(
            options.seed, self.counter, options.prefix_tokens, options.prefix_groups
        )
        self.sampler = options.workload.sampler(options.seed, worker_index)
        followup = options.followup_workload or options.workload
        self.followup_sampler = followup.sampler(options.seed + 1_000_003, worker_index)
        self.rng = random.Random(f"llmload-worker:{options.seed}:{worker_index}")

    def spec(self, arrival: Arrival | None, turn: Turn | None) -> tuple[RequestSpec, str]:
        """The next request's spec and its prompt (text, or its messages as JSON)."""
        if turn is not None:
            spec = RequestSpec(turn.scenario, turn.new_tokens, turn.max_tokens,
                               messages=turn.messages)  # fmt: skip
            return spec, json.dumps(turn.messages, sort_keys=True)
        trace = self.options.workload.trace  # a trace's arrival i sends its row i
        if trace is not None and arrival is not None:
            spec = trace.spec(arrival.index)
        else:
            spec = self.sampler.sample()
        if spec.messages is not None:
            return spec, json.dumps(spec.messages, sort_keys=True)
        if spec.prompt_text is not None:
            return spec, spec.prompt_text
        return spec, self._prompt(spec)

    def _prompt(self, spec: RequestSpec) -> str:
        """A built prompt of the spec's length (a trace's: beginning with its prefix blocks)."""
        if spec.prefix_blocks:
            return self.prompts.build_blocks(spec.prompt_tokens or 1, self.rng,
                                             spec.prefix_blocks, spec.block_tokens)  # fmt: skip
        return self.prompts.build(spec.prompt_tokens or 1, self.rng)

    def record(
        self,
        step: StepState,
        arrival: Arrival | None,
        turn: Turn | None,
        spec: RequestSpec,
        text: str,
        model: str | None,
        session: Arrival | None = None,
    ) -> RequestRecord:
        """The record of a request about to be sent: its step (an arrival's own, not the
        current step), what it asks for, and its session turn or open-loop schedule.
        `session`: a later turn's session's arrival (its first turn's): the turn belongs to
        that step and rate, whatever the step is now (the last step's drain, a pause)."""
        origin = arrival or session
        record = RequestRecord(
            request_id=new_request_id(),
            step=step.step if origin is None else origin.step,
            concurrency=step.concurrency if origin is None else origin.concurrency,
            cold=step.cold and arrival is None,
            scenario=spec.scenario,
            endpoint=self.options.endpoint,
            model=model,
            stream=self.options.stream,
            prompt_tokens_requested=spec.prompt_tokens,
            max_tokens=spec.max_tokens,
            prompt_sha256=prompt_hash(text),
            prompt_text=text if self.options.store_prompts else None,
        )
        if turn is not None:
            turn.apply(record)
            if origin is None and step.rate is not None:
                record.rate = step.rate  # a later turn of an open-loop session
        if origin is not None:  # an arrival, or a later turn of its session
            record.rate = origin.rate
        if arrival is not None:
            record.arrival_index = arrival.index
            record.intended_ns = arrival.intended_ns
            record.queued_ns = arrival.queued_ns
        return record
