"""One request on the wire: the keep-alive client, the SSE reader, the stream's
record, the deadlines, and the tokenizer that counts a delta's tokens.

Import from the room's modules; the package itself holds nothing.
"""
