"""Real inference engines for llmload's own tests and local trials (docs/engines.md).

`tiny_llama` builds a tiny random-weight Llama with a locally trained tokenizer (no hub);
`transformers_serve` runs `transformers serve` on it, `vllm_serve` runs vLLM's CPU build on
its `--head-dim-64` variant. Building needs the engine environment
(`requirements-engine.txt`: CPU torch and transformers); vLLM runs from its own
(`requirements-vllm.txt`, .venv-vllm). Nothing here is imported by the load generator or the
analysis.
"""
