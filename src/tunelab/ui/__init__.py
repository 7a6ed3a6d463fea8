"""`tunelab ui`: a local web page over plan, the runs folder, the tuned model and training runs (server.py)."""
