"""What master and workers share: the options, the manifest, the message protocol
and what a worker knows of the step, and secret redaction.

Import from the room's modules; the package itself holds nothing.
"""
