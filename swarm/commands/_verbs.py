"""What `swarm kick`, `swarm block` and `swarm unblock` share: options, signing, delivery."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from swarm.commands._network import add_network_options

ROLES = ("owner", "admin", "coordinator")


def configure(p: argparse.ArgumentParser, verb: str) -> None:
    add_network_options(p)
    p.add_argument("uri", help="the swarm's join URI")
    p.add_argument("peer", help="the peer's id (p... or 64 hex digits)")
    p.add_argument("--reason", default="", help="why (shown to operators, at most 200 bytes)")
    p.add_argument("--as", dest="role", choices=ROLES, default="owner",
                   help="act as the owner (FIDO2 key, default), an admin or the coordinator "
                        "(peer key)")
    p.add_argument("--owner-key", default="fido2", metavar="fido2|soft:PATH",
                   help="the owner's key when acting as owner")
    p.add_argument("--key", default=None, metavar="PATH",
                   help="peer key file when acting as admin or coordinator "
                        "(default: the data dir's peer.key)")


def run(args: argparse.Namespace, verb: str) -> int:
    from identity import PeerId, PeerKey
    from swarm import uri as uri_mod
    from swarm.errors import ConfigError

    join = uri_mod.parse(args.uri)
    try:
        target = PeerId.parse(args.peer)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    peer_key = None
    if args.role != "owner":
        from pathlib import Path

        from identity import KeyFileError

        path = Path(args.key) if args.key else args.data_dir / "peer.key"
        try:
            peer_key = PeerKey.load(path)
        except KeyFileError as exc:
            raise ConfigError(str(exc)) from None
    state = asyncio.run(_send(join, target, verb, args, peer_key))
    if verb == "kick":
        print(f"kicked {target.short()} (order sent to the coordinator)")
    else:
        print(f"{verb}ed {target.short()} at term {state.term} by the coordinator "
              f"{state.coordinator.short()}")
    return 0


async def _send(join, target, verb, args, peer_key):
    from identity import (
        BlockCommand,
        IdentityError,
        KickCommand,
        PeerKey,
        Role,
        Signed,
        UnblockCommand,
        assert_statement,
        sign_as_peer,
    )
    from swarm.control import observer, owned
    from swarm.errors import ConfigError, SwarmError

    cls = {"kick": KickCommand, "block": BlockCommand, "unblock": UnblockCommand}[verb]
    async with observer.dht_observer(join) as node:
        view = await observer.observe(node, join)
        if view.state is None:
            raise SwarmError("the swarm has no coordinator yet; try again in a few seconds")
        try:
            stmt = cls(swarm=join.pubkey, counter=int(time.time() * 1000), target=target,
                       reason=args.reason, role=Role(args.role), term=view.state.term)
        except IdentityError as exc:
            raise ConfigError(str(exc)) from None
        if args.role == "owner":
            auth = owned.open_owner_key(args.owner_key)
            try:
                proof = None
                for cred in view.charter.ownership.owners:
                    try:
                        proof = await asyncio.to_thread(assert_statement, auth, cred, stmt)
                        break
                    except IdentityError as exc:
                        last = exc
                if proof is None:
                    from swarm.errors import LocalError

                    raise LocalError(f"this owner key is not the swarm's owner key: {last}")
            finally:
                auth.close()
            signed = Signed(stmt, (proof,))
            sender = PeerKey.generate()
        else:
            signed = Signed(stmt, (sign_as_peer(stmt, peer_key),))
            sender = peer_key
        print(f"sending {verb} of {target.short()} to coordinator {view.coordinator.short()} "
              f"(term {view.state.term})", file=sys.stderr)
        return await observer.send_command(node, join, view, signed, sender)
