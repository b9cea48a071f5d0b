"""The roles table: who may kick, block, unblock, change policy, appoint, transfer, submit."""

from __future__ import annotations

import pytest

from identity import Action, Role, may
from identity.roles import PERMISSIONS, table

EXPECTED = {
    #              kick   block  unblock policy admins transfer submit
    "owner":       (True, True, True, True, True, True, True),
    "admin":       (True, True, True, False, False, False, True),
    "coordinator": (True, True, True, False, False, False, True),
    "worker":      (False, False, False, False, False, False, False),
    "requester":   (False, False, False, False, False, False, True),
}
ACTIONS = ["kick", "block", "unblock", "change_policy", "appoint_admins", "transfer_ownership",
           "submit_jobs"]


@pytest.mark.parametrize("role", sorted(EXPECTED))
def test_table(role):
    assert tuple(may(role, a) for a in ACTIONS) == EXPECTED[role]
    assert tuple(may(Role(role), Action(a)) for a in ACTIONS) == EXPECTED[role]


def test_only_the_owner_changes_policy_appoints_and_transfers():
    for action in (Action.CHANGE_POLICY, Action.APPOINT_ADMINS, Action.TRANSFER_OWNERSHIP):
        assert [r for r in Role if may(r, action)] == [Role.OWNER]


def test_unknown_names_are_not_allowed():
    assert not may("root", "kick")
    assert not may("owner", "format_disk")


def test_table_rows_cover_every_role():
    assert [r for r, _ in table()] == [r.value for r in Role]
    assert set(PERMISSIONS) == set(Role)
