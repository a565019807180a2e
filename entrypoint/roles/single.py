"""One host, or a host outside the distribution: nothing beside its processes, and it writes
the whole job report itself (the base's lifecycle, unchanged)."""

from __future__ import annotations

from entrypoint.roles.base import HostRole


class SingleHost(HostRole):
    """Every process of the job is this host's: its figures are the whole report."""
