"""``python -m hlo_guard``: the same command line as the ``hlo-guard`` script."""

import sys

from hlo_guard.cli import main

sys.exit(main())
