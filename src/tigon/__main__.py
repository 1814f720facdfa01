"""``python -m tigon``: the ``tigon`` command (the same as the console script and ``python -m tigon.cli``)."""

import sys

from tigon.cli import main

if __name__ == "__main__":
    sys.exit(main())
