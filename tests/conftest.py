"""Test-session setup that must happen before JAX is imported.

* 8 virtual CPU devices, so the sharding tests run under a plain ``pytest``
  as well as under ``make test`` (which exports the same flag);
* quiet TensorFlow/XLA logging;
* ``tests/`` on ``sys.path`` so helper packages (``fuzzlib``) import the same
  way whatever the rootdir or import mode.
"""

import os
import sys

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: long-running; also covered by a quicker variant (deselect with -m 'not slow')",
    )


@pytest.fixture
def small_calls_kept(monkeypatch):
    """Keep small ``jax.jit`` calls as calls in the guard's staged trace (it
    inlines them: ``compat.SMALL_CALL_EQUATIONS``), for tests of the guarded
    call machinery written with small helpers."""
    from hlo_guard.jax_frontend import compat

    monkeypatch.setattr(compat, "SMALL_CALL_EQUATIONS", -1)
