"""llmload locustfiles: the package that runs inside Locust (chat user, workloads, sink)."""
