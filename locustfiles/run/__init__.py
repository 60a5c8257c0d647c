"""What master and workers share: the options, the manifest, the message protocol
and what a worker knows of the step, and secret redaction."""

from __future__ import annotations

from locustfiles import public_face

__all__ = [
    "ChatOptions",
    "ProbeRecord",
    "RunManifest",
    "StepState",
    "add_arguments",
    "from_parsed",
    "redact",
    "secret_values",
    "write_manifest",
]

__getattr__ = public_face(
    __name__,
    {
        "ChatOptions": "options",
        "ProbeRecord": "manifest",
        "RunManifest": "manifest",
        "StepState": "protocol",
        "add_arguments": "options",
        "from_parsed": "options",
        "redact": "secrets",
        "secret_values": "secrets",
        "write_manifest": "manifest",
    },
)
