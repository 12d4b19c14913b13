"""``python -m apps.md``: see ``python -m apps.md --help``."""

import sys

from apps.md.app import main

if __name__ == "__main__":
    sys.exit(main())
