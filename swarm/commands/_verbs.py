"""What `swarm kick`, `swarm block` and `swarm unblock` share: options, signing, delivery."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from swarm.commands._common import add_json_option, check_owner_key, open_owner_key, print_json

if TYPE_CHECKING:
    from identity import PeerId

log = logging.getLogger("swarm.commands")

ROLES = ("owner", "admin", "coordinator")
HELPS = {
    "kick": "disconnect a peer now (its shards are reassigned; it may rejoin)",
    "block": "keep a peer out of the swarm until unblocked (survives restarts)",
    "unblock": "lift a block",
}
"""Each verb's line in ``swarm --help``."""
_AUTHORITY = """.

Authorised by the owner's FIDO2 key (--as owner, the default), an admin's peer key
(--as admin --key PATH) or the coordinator's (--as coordinator), as the roles table allows.
The command carries the current term; the coordinator checks it against the charter.
"""


def command(verb: str) -> tuple[str, str, Callable[[argparse.ArgumentParser], None],
                                 Callable[[argparse.Namespace], int]]:
    """``(HELP, DESCRIPTION, configure, run)`` of the ``swarm <verb>`` command module (the
    three verbs differ only in their words and the statement they sign)."""
    return (HELPS[verb], HELPS[verb] + _AUTHORITY, lambda p: configure(p, verb),
            lambda args: run(args, verb))
_BASE32 = set("abcdefghijklmnopqrstuvwxyz234567")
_HEX = set("0123456789abcdef")


def configure(p: argparse.ArgumentParser, verb: str) -> None:
    from swarm.commands._network import add_network_options

    add_network_options(p)
    p.add_argument("uri", help="the swarm's join URI")
    p.add_argument("peer", help="the peer's id, or any unique start of it (as `swarm status` "
                                "shows it, e.g. its first 12 characters)")
    p.add_argument("--reason", default="", help="why (shown to operators, at most 200 bytes)")
    p.add_argument("--as", dest="role", choices=ROLES, default="owner",
                   help="act as the owner (FIDO2 key, default), an admin or the coordinator "
                        "(peer key)")
    p.add_argument("--owner-key", default="fido2", metavar="fido2|soft:PATH",
                   help="the owner's key when acting as owner")
    p.add_argument("--key", default=None, metavar="PATH",
                   help="peer key file when acting as admin or coordinator "
                        "(default: the data dir's peer.key)")
    add_json_option(p, "what was done")


def check_peer_text(text: str) -> None:
    """A peer id or the start of one: what can be refused before going on the network."""
    from identity import PeerId
    from swarm.errors import ConfigError

    try:
        PeerId.parse(text)
        return
    except ValueError:
        pass
    low = text.lower()
    if not low or len(low) > 64 or not (set(low) <= _BASE32 or set(low) <= _HEX):
        raise ConfigError(f"{text[:70]!r} is not a peer id or the start of one (expected "
                          f"'p' and base32 letters as `swarm status` shows them)")


def resolve_peer(text: str, known: Iterable[PeerId]) -> PeerId:
    """The peer ``text`` names: a whole id, or the one id among ``known`` (the members and
    blocked peers seen just now) that starts with it, as git takes a hash's prefix. None or
    several matching is a usage error listing what there is."""
    from identity import PeerId
    from swarm.errors import ConfigError

    try:
        return PeerId.parse(text)
    except ValueError:
        pass
    low = text.lower()
    matches = sorted({p for p in known if str(p).startswith(low) or p.raw.hex().startswith(low)},
                     key=str)
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ConfigError(f"no member or blocked peer of this swarm has an id starting with "
                          f"{text!r}; `swarm status URI` lists them")
    shown = ", ".join(str(p)[:16] for p in matches[:8])
    raise ConfigError(f"{text!r} is ambiguous: {len(matches)} peers start with it ({shown}); "
                      f"give more characters")


def run(args: argparse.Namespace, verb: str) -> int:

    from identity import PeerKey
    from swarm import loop as swarm_loop
    from swarm import uri as uri_mod
    from swarm.commands._network import bootstrap_addresses, unreachable, with_remembered
    from swarm.errors import ConfigError, RemoteError

    join = with_remembered(uri_mod.parse(args.uri).with_peers(bootstrap_addresses(args)),
                           args.data_dir)
    check_peer_text(args.peer)
    if args.role == "owner":
        check_owner_key(args.owner_key)
    peer_key = None
    if args.role != "owner":
        from pathlib import Path

        from identity import KeyFileError

        path = Path(args.key) if args.key else args.data_dir / "peer.key"
        try:
            peer_key = PeerKey.load(path)
        except KeyFileError as exc:
            raise ConfigError(str(exc)) from None
    try:
        target, state = swarm_loop.run(_send(join, verb, args, peer_key))
    except RemoteError as exc:
        raise unreachable(exc, len(join.peers)) from None
    if args.json:
        # a kick is fire-and-forget; a block or unblock is confirmed in the coordinator's state
        print_json({"action": verb, "peer": str(target), "role": args.role,
                    "reason": args.reason, "confirmed": verb != "kick", "term": state.term,
                    "coordinator": str(state.coordinator)})
    elif verb == "kick":
        print(f"kicked {target.short()} (order sent to the coordinator)")
    else:
        print(f"{verb}ed {target.short()} at term {state.term} by the coordinator "
              f"{state.coordinator.short()}")
    return 0


async def _send(join, verb, args, peer_key):
    import asyncio

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
    from swarm.commands._network import remember
    from swarm.control import observer
    from swarm.errors import ConfigError, SwarmError

    cls = {"kick": KickCommand, "block": BlockCommand, "unblock": UnblockCommand}[verb]
    async with observer.dht_observer(join) as node:
        view = await observer.observe(node, join)
        remember(args.data_dir, join.swarm_id, view.addrs.values())
        if view.state is None:
            raise SwarmError("the swarm has no coordinator yet; try again in a few seconds")
        known = [r.peer_id for r, _ in view.members] + [b.peer for b in view.state.blocked]
        target = resolve_peer(args.peer, known)
        try:
            stmt = cls(swarm=join.pubkey, counter=int(time.time() * 1000), target=target,
                       reason=args.reason, role=Role(args.role), term=view.state.term)
        except IdentityError as exc:
            raise ConfigError(str(exc)) from None
        if args.role == "owner":
            auth = open_owner_key(args.owner_key)
            try:
                proof = None
                for cred in view.charter.ownership.owners:
                    try:
                        proof = await asyncio.to_thread(assert_statement, auth, cred, stmt)
                        break
                    except IdentityError as exc:
                        log.debug("owner key %s: %s", cred.short(), exc)
                if proof is None:
                    from swarm.errors import ConsentRefused

                    raise ConsentRefused(
                        f"not authorised: {args.owner_key} is not an owner key of this swarm "
                        f"(its owner key is {view.charter.ownership.owner.short()}); give the "
                        f"--owner-key that `swarm publish` used")
            finally:
                auth.close()
            signed = Signed(stmt, (proof,))
            sender = PeerKey.generate()
        else:
            signed = Signed(stmt, (sign_as_peer(stmt, peer_key),))
            sender = peer_key
        print(f"sending {verb} of {target.short()} to coordinator {view.coordinator.short()} "
              f"(term {view.state.term})", file=sys.stderr)
        # kick: nothing to wait for, so the state it was sent under
        return target, await observer.send_command(node, join, view, signed, sender) or view.state
