"""`python -m functrain.launch`: see `functrain.launch.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
