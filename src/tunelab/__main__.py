"""`python -m tunelab` runs the CLI, as `tunelab` and `python -m tunelab.cli` do."""

import sys

from tunelab.cli import main

if __name__ == "__main__":
    sys.exit(main())
