"""Errors raised for wrong use, each naming the problem."""


class HloGuardError(Exception):
    """Base class of hlo_guard's own errors."""


class GuardUsageError(HloGuardError, TypeError):
    """The function or its arguments cannot be guarded as given."""
