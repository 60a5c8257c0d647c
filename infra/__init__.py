"""llmload infra: stand systems up (simulated engine, local store, campaigns) and the CLI."""
