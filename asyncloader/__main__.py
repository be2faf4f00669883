"""``python -m asyncloader`` is the ``asyncloader`` command."""

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
