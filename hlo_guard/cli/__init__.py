"""The ``hlo-guard`` command line (``python -m hlo_guard``); see :mod:`hlo_guard.cli.main`."""
from hlo_guard.cli.main import main

__all__ = ["main"]
