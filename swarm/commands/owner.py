"""`swarm owner`: show the owner, appoint or remove admins, transfer ownership."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from swarm.commands._network import add_network_options

HELP = "show or change a swarm's ownership: show, add-admin, remove-admin, transfer"
DESCRIPTION = """\
show:          the verified owner (hardware-backed or not), admins and policy.
add-admin:     list a peer as an admin in the charter (the owner's key signs it).
remove-admin:  take a peer off the charter's admins.
transfer:      hand the swarm to another owner key; both keys sign (old, then new).

Changes re-sign the charter item with the swarm key, so they run with the data dir that
published the swarm (`swarm publish --name ...`); members pick the new charter up within
seconds. Older statements stay in the DHT as the chain every member verifies.
"""


def _common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The shared options, also accepted after the action (SUPPRESS keeps the parent's)."""
    p.add_argument("--data-dir", metavar="DIR", default=argparse.SUPPRESS,
                   help="the data dir (the publisher's, to change ownership)")
    p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS)
    p.add_argument("-q", "--quiet", action="count", default=argparse.SUPPRESS)
    add_network_options(p)
    return p


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = _common(sub.add_parser("show", help="print the verified ownership"))
    show.add_argument("uri")
    show.add_argument("--json", action="store_true")
    for name, text in (("add-admin", "make PEER an admin"),
                       ("remove-admin", "remove PEER from the admins")):
        s = _common(sub.add_parser(name, help=text))
        s.add_argument("uri")
        s.add_argument("peer", help="the peer's id (p... or 64 hex digits)")
        s.add_argument("--owner-key", default="fido2", metavar="fido2|soft:PATH")
    t = _common(sub.add_parser("transfer", help="transfer ownership to another key"))
    t.add_argument("uri")
    t.add_argument("--owner-key", default="fido2", metavar="fido2|soft:PATH",
                   help="the current owner's key")
    t.add_argument("--new-owner-key", required=True, metavar="fido2|soft:PATH",
                   help="the new owner's key (enrolled now; touch it when asked)")


def run(args: argparse.Namespace) -> int:
    from swarm import uri as uri_mod

    join = uri_mod.parse(args.uri)
    if args.action == "show":
        return _show(join, args.json)
    return asyncio.run(_change(join, args))


def _show(join, as_json: bool) -> int:
    from swarm.control import observer

    async def look():
        async with observer.dht_observer(join) as node:
            from swarm.control import charter

            return await charter.fetch(node, join.pubkey, join.owner or None)

    rec = asyncio.run(look())
    own = rec.ownership
    data = {"name": own.name, "owner": own.owner.fingerprint().hex(),
            "hardware_backed": own.owner.hardware_backed, "attestation": own.owner.attestation,
            "owner_keys": [c.fingerprint().hex() for c in own.owners],
            "admins": sorted(str(p) for p in own.admins),
            "policy": {"require_hardware": own.policy.require_hardware},
            "chain_length": len(rec.history) + 1, "pinned": bool(join.owner)}
    if as_json:
        print(json.dumps(data, indent=1, sort_keys=True))
        return 0
    print(f"swarm {own.name!r}: owner key {data['owner'][:12]} "
          f"({'hardware-backed' if own.owner.hardware_backed else 'NOT hardware-backed'}, "
          f"{own.owner.attestation} attestation)"
          + (" [pinned by the URI]" if join.owner else " [URI has no owner pin]"))
    print(f"admins: {', '.join(a[:12] for a in data['admins']) or 'none'}")
    print(f"policy: require_hardware={own.policy.require_hardware}; "
          f"chain of {data['chain_length']} statement(s)")
    return 0


async def _change(join, args) -> int:
    from identity import Charter, IdentityError, OwnershipTransfer, PeerId, Signed
    from identity.statements import MAX_CHARTER_ADMINS
    from swarm.control import charter, observer, owned
    from swarm.errors import ConfigError

    mine = owned.find_by_key(args.data_dir, join.pubkey)
    if mine is None:
        raise ConfigError("this data dir did not publish that swarm: ownership changes need "
                          "its swarm key (run with the publisher's --data-dir)")
    auth = owned.open_owner_key(args.owner_key)
    try:
        async with observer.dht_observer(join) as node:
            rec = await charter.fetch(node, join.pubkey, join.owner or None)
            head: Charter = rec.charter
            own = rec.ownership
            cred = next((c for c in own.owners if c.credential_id ==
                         mine.credential.credential_id), own.owner)
            history = list(mine.history) + [mine.head.encode()]
            from identity import assert_statement, enrol

            if args.action in ("add-admin", "remove-admin"):
                try:
                    peer = PeerId.parse(args.peer)
                except ValueError as exc:
                    raise ConfigError(str(exc)) from None
                admins = set(head.admins)
                if args.action == "add-admin":
                    admins.add(peer)
                else:
                    admins.discard(peer)
                if len(admins) > MAX_CHARTER_ADMINS:
                    raise ConfigError(f"a charter lists at most {MAX_CHARTER_ADMINS} admins")
                stmt = Charter(swarm=join.pubkey, counter=own.counter + 1, name=head.name,
                               owners=head.owners, policy=head.policy,
                               admins=tuple(sorted(admins)))
                new_head = Signed(stmt, (assert_statement(auth, cred, stmt),))
            else:
                new_auth = owned.open_owner_key(args.new_owner_key)
                try:
                    new_cred = enrol(new_auth)
                    transfer = OwnershipTransfer(swarm=join.pubkey, counter=own.counter + 1,
                                                 new_owner=new_cred)
                    signed_t = Signed(transfer, (assert_statement(auth, cred, transfer),
                                                 assert_statement(new_auth, new_cred,
                                                                  transfer)))
                    stmt = Charter(swarm=join.pubkey, counter=own.counter + 2, name=head.name,
                                   owners=(new_cred,), policy=head.policy, admins=head.admins)
                    new_head = Signed(stmt, (assert_statement(new_auth, new_cred, stmt),))
                finally:
                    new_auth.close()
                history.append(signed_t.encode())
                mine.credential = new_cred
            targets = tuple([await node.put_immutable(h) for h in history])
            await charter.publish(node, mine.swarm_key, new_head, targets)
            check = await charter.fetch(node, join.pubkey, join.owner or None)
    except IdentityError as exc:
        raise ConfigError(f"the ownership change does not verify: {exc}") from None
    finally:
        auth.close()
    mine.head, mine.history = new_head, history
    mine.save()
    print(f"charter updated (counter {check.ownership.counter}): owner "
          f"{check.ownership.owner.short()}, admins "
          f"{', '.join(p.short() for p in sorted(check.ownership.admins)) or 'none'}",
          file=sys.stderr)
    return 0
