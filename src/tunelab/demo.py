"""`python -m tunelab.demo` (`make demo`): the demo lives in commands/demo.py."""

import sys

from tunelab.commands.demo import main

if __name__ == "__main__":
    sys.exit(main())
