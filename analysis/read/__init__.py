"""Reading a stored run: the parts' files (`partfs`), a run's manifest, requests and chunk
parts (`load`), what is missing (`completeness`), the target's scraped metrics
(`server_metrics`), the workers' clock offsets (`clocks`), and the embedded DuckDB over the
parts where they lie (`engine`).
"""
