"""`swarm owner`: show the owner, appoint or remove admins, transfer ownership."""

from __future__ import annotations

import argparse
import sys

from swarm.commands._common import (
    add_global_options,
    add_json_option,
    open_owner_key,
    print_json,
    print_table,
)

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


def _action(sub, name: str, text: str) -> argparse.ArgumentParser:
    """One action's parser: the swarm's URI, --json, and the global options after it too."""
    from swarm.commands._network import add_network_options

    p = sub.add_parser(name, help=text)
    add_global_options(p)
    p.add_argument("uri")
    add_json_option(p, "the ownership" if name == "show" else "the updated ownership")
    return add_network_options(p)


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    _action(sub, "show", "print the verified ownership")
    for name, text in (("add-admin", "make PEER an admin"),
                       ("remove-admin", "remove PEER from the admins")):
        s = _action(sub, name, text)
        s.add_argument("peer", help="the peer's id, or any unique start of it (as `swarm "
                                    "status` shows it)")
        s.add_argument("--owner-key", default="fido2", metavar="fido2|soft:PATH")
    t = _action(sub, "transfer", "transfer ownership to another key")
    t.add_argument("--owner-key", default="fido2", metavar="fido2|soft:PATH",
                   help="the current owner's key")
    t.add_argument("--new-owner-key", required=True, metavar="fido2|soft:PATH",
                   help="the new owner's key (enrolled now; touch it when asked)")


def run(args: argparse.Namespace) -> int:

    from swarm import loop as swarm_loop
    from swarm import uri as uri_mod
    from swarm.commands._network import bootstrap_addresses, unreachable, with_remembered
    from swarm.errors import RemoteError

    join = with_remembered(uri_mod.parse(args.uri).with_peers(bootstrap_addresses(args)),
                           args.data_dir)
    if getattr(args, "peer", None) is not None:
        from swarm.commands._verbs import check_peer_text

        check_peer_text(args.peer)
    if args.action != "show":
        from swarm.commands._common import check_owner_key

        check_owner_key(args.owner_key)
    try:
        if args.action == "show":
            return _show(join, args.json)
        return swarm_loop.run(_change(join, args))
    except RemoteError as exc:
        raise unreachable(exc, len(join.peers)) from None


def ownership_json(rec, pinned: bool) -> dict:
    """A verified charter record as the JSON `owner show` prints (and changes print after)."""
    own = rec.ownership
    return {"name": own.name, "owner": own.owner.fingerprint().hex(),
            "hardware_backed": own.owner.hardware_backed, "attestation": own.owner.attestation,
            "owner_keys": [c.fingerprint().hex() for c in own.owners],
            "admins": sorted(str(p) for p in own.admins),
            "policy": {"require_hardware": own.policy.require_hardware},
            "counter": own.counter, "chain_length": len(rec.history) + 1, "pinned": pinned}


def _show(join, as_json: bool) -> int:

    from swarm import loop as swarm_loop
    from swarm.control import charter, observer

    async def look():
        async with observer.dht_observer(join) as node:
            return await charter.fetch(node, join.pubkey, join.owner or None)

    data = ownership_json(swarm_loop.run(look()), bool(join.owner))
    if as_json:
        print_json(data)
        return 0
    owner = (f"{data['owner'][:12]} ("
             f"{'hardware-backed' if data['hardware_backed'] else 'NOT hardware-backed'}, "
             f"{data['attestation']} attestation)")
    print_table(("", "value"), [
        ("owner key", owner),
        ("pinned", "yes, by the URI" if data["pinned"] else "no (the URI has no owner pin)"),
        ("admins", ", ".join(a[:12] for a in data["admins"]) or "none"),
        ("policy", f"require_hardware={data['policy']['require_hardware']}"),
        ("chain", f"{data['chain_length']} statement(s), counter {data['counter']}"),
    ], title=f"swarm {data['name']!r}")
    return 0


async def _change(join, args) -> int:
    from identity import Charter, IdentityError, OwnershipTransfer, Signed
    from identity.errors import AuthenticatorError
    from identity.statements import MAX_CHARTER_ADMINS
    from swarm.commands import owned
    from swarm.control import charter, observer
    from swarm.errors import ConfigError

    mine = owned.find_by_key(args.data_dir, join.pubkey)
    if mine is None:
        raise ConfigError("this data dir did not publish that swarm: ownership changes need "
                          "its swarm key (run with the publisher's --data-dir)")
    auth = open_owner_key(args.owner_key)
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
                from swarm.commands._verbs import resolve_peer

                view = await observer.observe(node, join)
                peer = resolve_peer(args.peer, [r.peer_id for r, _ in view.members]
                                    + list(head.admins))
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
                new_auth = open_owner_key(args.new_owner_key, create=True)
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
    except AuthenticatorError:  # the key holds no credential of this swarm (CTAP detail)
        from swarm.errors import ConsentRefused

        raise ConsentRefused(f"not authorised: {args.owner_key} is not an owner key of this "
                             f"swarm; give the --owner-key that `swarm publish` used") from None
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
    if args.json:
        print_json(ownership_json(check, bool(join.owner)))
    return 0
