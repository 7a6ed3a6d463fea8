"""`tunelab serve`: an OpenAI-compatible server over a base model and its adapters (pool.py: the models; engine.py:
the batched generation through eval/sampling.py; app.py: the HTTP API)."""
