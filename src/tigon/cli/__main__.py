"""``python -m tigon.cli``: the ``tigon`` command."""

import sys

from tigon.cli import main

sys.exit(main())
