"""Recognise secrets so they never reach parts, manifests or logs.

Two nets: by name (config keys such as `api_key`, `aws_secret_access_key`, `hf_token`,
`password` are dropped) and by value (the values of secret-named environment variables
are redacted wherever they appear in text that llmload writes).

Names are matched word by word (`max_tokens`, `tokenizer` and `prompt_tokens` are not
secrets; `api_key`, `apiKey`, `auth_token`, `AWS_SECRET_ACCESS_KEY` are). A key that names
an environment variable (`api_key_env: OPENAI_API_KEY`) is kept: its value is a name, not a
secret.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping

SECRET_WORDS = frozenset(
    {
        "key",
        "apikey",
        "secret",
        "token",
        "password",
        "passwd",
        "credential",
        "credentials",
        "authorization",
    }
)
_ENV_SUFFIXES = ("env", "envvar", "var")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
MIN_SECRET_LEN = 6  # shorter values would redact ordinary text


def name_words(name: str) -> list[str]:
    """`apiKey` → [api, key]; `AWS_SECRET_ACCESS_KEY` → [aws, secret, access, key]."""
    return [w.lower() for w in _WORD.findall(name)]


def is_secret_name(name: str) -> bool:
    words = name_words(name)
    return any(w in SECRET_WORDS or w.endswith(("apikey", "secret", "password")) for w in words)


def names_env_var(name: str, value: object) -> bool:
    """`api_key_env: "OPENAI_API_KEY"`: the key holds the name of an environment variable."""
    words = name_words(name)
    return (
        bool(words)
        and words[-1] in _ENV_SUFFIXES
        and isinstance(value, str)
        and bool(_ENV_NAME.match(value))
    )


def secret_values(environ: Mapping[str, str], names: Iterable[str] = ()) -> tuple[str, ...]:
    """Values of secret-named environment variables, and of the variables `names` (the one
    `--api-key-env` names, whatever its name: `MYAUTH` holds a key as much as
    `OPENAI_API_KEY`), longest first (for redaction)."""
    named = {n for n in names if n}
    values = {
        v
        for k, v in environ.items()
        if (k in named or (is_secret_name(k) and not names_env_var(k, v)))
        and len(v) >= MIN_SECRET_LEN
    }
    return tuple(sorted(values, key=len, reverse=True))


def run_secrets(api_key_env: str) -> tuple[str, ...]:
    """The secrets of a run in this process: the secret-named variables' values and the key
    `--api-key-env` names (`api_key_env`)."""
    return secret_values(os.environ, (api_key_env,))


def redact(text: str, secrets: tuple[str, ...], replacement: str = "<redacted>") -> str:
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, replacement)
    return text


class RedactingFilter(logging.Filter):
    """Every log record of the process with its secrets redacted, whoever logs it (llmload,
    Locust echoing a failure, boto3 at DEBUG naming an access key id)."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        message = record.getMessage()
        clean = redact(message, self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:  # a traceback's text, formatted once here
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        return True


def redact_logs(secrets: tuple[str, ...]) -> None:
    """Redact `secrets` (with those already given) in every record the root logger's
    handlers write, now and for handlers that share them. One filter per handler."""
    for handler in logging.getLogger().handlers:
        found = [f for f in handler.filters if isinstance(f, RedactingFilter)]
        if found:
            merged = set(found[0].secrets) | set(secrets)
            found[0].secrets = tuple(sorted(merged, key=len, reverse=True))
        else:
            handler.addFilter(RedactingFilter(secrets))
