"""`tunelab report`'s content: reading stored runs into sections (sections.py) and drawing plots (plots.py)."""
