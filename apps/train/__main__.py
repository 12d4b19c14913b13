"""``python -m apps.train``: see ``python -m apps.train --help``."""

import sys

from apps.train.app import main

if __name__ == "__main__":
    sys.exit(main())
