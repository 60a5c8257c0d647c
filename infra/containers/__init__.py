"""Helpers run inside llmload's image by the container deployments (infra/compose, infra/k8s)."""
