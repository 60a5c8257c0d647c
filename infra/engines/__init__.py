"""Real inference engines for llmload's own tests and local trials (docs/engines.md).

`tiny_llama` builds a tiny random-weight Llama with a locally trained tokenizer (no hub);
`transformers_serve` runs `transformers serve` on it. Both need the engine environment
(`requirements-engine.txt`: CPU torch and transformers); nothing here is imported by the
load generator or the analysis.
"""
