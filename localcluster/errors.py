"""Errors localcluster reports to its users."""


class ClusterError(RuntimeError):
    """The cluster could not be built, used or removed; the message says what to do."""
