"""``python -m apps.stencil``: see ``python -m apps.stencil --help``."""

import sys

from apps.stencil.app import main

if __name__ == "__main__":
    sys.exit(main())
