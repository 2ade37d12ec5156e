"""The ``hlo-guard`` command line (``python -m hlo_guard``); see :mod:`hlo_guard.cli.main`."""

from hlo_guard.cli.main import EXIT_ERROR, EXIT_OK, EXIT_STRICT, EXIT_USAGE, EXIT_VIOLATION, main

__all__ = ["main", "EXIT_OK", "EXIT_VIOLATION", "EXIT_USAGE", "EXIT_STRICT", "EXIT_ERROR"]
