"""The error hierarchy, drawn once.

    LlmloadError                 base of every error llmload raises on purpose
    ├── UsageError               bad input from a user (option, file, URI); CLI exit 2
    ├── SchemaVersionError       events written by an unknown major schema version
    └── EventDataError           event rows that cannot be right (duplicate request ids...)
        └── InvalidTimelineError a request's timestamps contradict each other

Library code raises these; only the CLI turns them into one-line messages and exit codes.
Failures *during* a load run are data (a request row with an error kind), never exceptions.
"""

from __future__ import annotations


class LlmloadError(Exception):
    """Base class of llmload's own errors."""


class UsageError(LlmloadError):
    """Bad input from the user: the message names the problem and the fix."""


class SchemaVersionError(LlmloadError):
    """Events were written with a schema major version this reader does not know."""


class EventDataError(LlmloadError):
    """Event rows contradict the schema's rules (a request id twice, a row without keys...)."""


class InvalidTimelineError(EventDataError):
    """A request's timeline is impossible (end before last token, tokens out of order...).

    `request_ids` lists every offending request; the message names the first one.
    """

    def __init__(self, reason: str, request_ids: list[str]) -> None:
        self.reason = reason
        self.request_ids = list(request_ids)
        more = f" (and {len(request_ids) - 1} more)" if len(request_ids) > 1 else ""
        first = request_ids[0] if request_ids else "?"
        super().__init__(f"invalid timeline for request {first}{more}: {reason}")
