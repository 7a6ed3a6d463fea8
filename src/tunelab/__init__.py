"""tunelab: fast LLM fine-tuning that predicts and measures its own time, memory and cost."""

__version__ = "0.1.0"
