"""What master and workers share: the options, the manifest, the message protocol
and what a worker knows of the step, and secret redaction."""

from __future__ import annotations

from locustfiles import public_face

__all__ = [
    "ChatOptions",
    "ProbeRecord",
    "RunManifest",
    "StepState",
    "TABLE",
    "add_arguments",
    "command_line",
    "from_parsed",
    "redact",
    "secret_values",
    "send_probe",
    "write_manifest",
]

__getattr__ = public_face(
    __name__,
    {
        "ChatOptions": "options",
        "ProbeRecord": "manifest",
        "RunManifest": "manifest",
        "StepState": "protocol",
        "TABLE": "table",
        "add_arguments": "table",
        "command_line": "table",
        "from_parsed": "options",
        "redact": "secrets",
        "secret_values": "secrets",
        "send_probe": "probe",
        "write_manifest": "manifest",
    },
)
