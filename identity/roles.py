"""Who may do what: the one table of roles and permissions.

The owner holds a FIDO2 key; admins and the coordinator act with their peer keys; workers
run tasks; requesters submit jobs. A peer can hold several roles at once (a coordinator is
also a worker); each signed command names the role it is made under.
"""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    OWNER = "owner"
    ADMIN = "admin"
    COORDINATOR = "coordinator"
    WORKER = "worker"
    REQUESTER = "requester"


class Action(StrEnum):
    KICK = "kick"
    BLOCK = "block"
    UNBLOCK = "unblock"
    CHANGE_POLICY = "change_policy"
    APPOINT_ADMINS = "appoint_admins"
    TRANSFER_OWNERSHIP = "transfer_ownership"
    SUBMIT_JOBS = "submit_jobs"


_K, _B, _U = Action.KICK, Action.BLOCK, Action.UNBLOCK
_P, _A, _T, _S = (Action.CHANGE_POLICY, Action.APPOINT_ADMINS, Action.TRANSFER_OWNERSHIP,
                  Action.SUBMIT_JOBS)

PERMISSIONS: dict[Role, frozenset[Action]] = {
    #                                kick block unblock policy admins transfer submit
    Role.OWNER: frozenset({_K, _B, _U, _P, _A, _T, _S}),
    Role.ADMIN: frozenset({_K, _B, _U, _S}),
    Role.COORDINATOR: frozenset({_K, _B, _U, _S}),
    Role.WORKER: frozenset(),
    Role.REQUESTER: frozenset({_S}),
}
"""The table. Admin rights may be narrowed per admin by a delegation's scope, never widened."""


def may(role: Role | str, action: Action | str) -> bool:
    """True when ``role`` may perform ``action``; unknown names are simply not allowed."""
    try:
        return Action(action) in PERMISSIONS[Role(role)]
    except ValueError:
        return False


def table() -> list[tuple[str, list[str]]]:
    """The table as rows (role, allowed action names), for docs and ``--help`` output."""
    return [(role.value, sorted(a.value for a in PERMISSIONS[role])) for role in Role]
