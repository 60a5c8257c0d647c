"""What master and workers share beyond the options: the manifest, the one probe helper, the
one request body, the message protocol and what a worker knows of the step, and secret
redaction.

Import from the room's modules; the package itself holds nothing.
"""
