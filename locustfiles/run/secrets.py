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

import re
from collections.abc import Mapping

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


def secret_values(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Values of secret-named environment variables, longest first (for redaction)."""
    values = {
        v
        for k, v in environ.items()
        if is_secret_name(k) and not names_env_var(k, v) and len(v) >= MIN_SECRET_LEN
    }
    return tuple(sorted(values, key=len, reverse=True))


def redact(text: str, secrets: tuple[str, ...], replacement: str = "<redacted>") -> str:
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, replacement)
    return text
