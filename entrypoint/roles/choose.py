"""This host's role, chosen once from the plan by its launcher family (decide/launchers/: the
one registry): the family names the role's class, and only that module is imported, so a
1-host job imports single.py alone, the multi-host roles only when the launch has several
hosts. No switch on the role here: a new family's role is its own module's line."""

from __future__ import annotations

import importlib

from entrypoint.decide.launchers import find_family_of_role
from entrypoint.decide.plan import LaunchPlan
from entrypoint.roles.base import HostRole


def choose_role(plan: LaunchPlan) -> tuple[HostRole, str, bool]:
    """This host's role, the job in a few words, and whether a crash may be restarted in place."""
    family = find_family_of_role(plan.role)
    module, name, options = family.decide_role(plan)
    role_class = getattr(importlib.import_module(module), name)
    return role_class(**options), family.describe(plan), family.decide_relaunched(plan)
