"""Owner-ceremony timings with the software authenticator, and encoded sizes.

Runs the same path as a security key (fido2's Fido2Client, CTAP2 CBOR, Fido2Server checks)
minus the human touch, so the figures are the software overhead a real ceremony adds on top
of the key's own signing time (a YubiKey needs roughly 50-200 ms plus the touch).

    python bench/identity.py [--n 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from identity import (  # noqa: E402
    Authenticator,
    Charter,
    PeerKey,
    Policy,
    Signed,
    SoftAuthenticator,
    TerminalInteraction,
    assert_statement,
    enrol,
    verify_chain,
    verify_proof,
)


class _Quiet(TerminalInteraction):
    def prompt_up(self) -> None:
        self.prompts += 1


def _median_ms(fn, n: int) -> tuple[float, float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), min(times)


def run(n: int) -> dict:
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for alg, name in ((-7, "ES256"), (-8, "EdDSA")):
            auth = Authenticator(SoftAuthenticator(Path(tmp) / f"{name}.key"), name, False,
                                 _Quiet())
            cred = enrol(auth, algorithms=[alg])
            rows[f"enrol {name}"] = _median_ms(lambda a=auth, g=alg: enrol(a, algorithms=[g]), n)
            swarm = PeerKey.generate()
            charter = Charter(swarm=swarm.public_bytes, counter=1, name="bench", owners=(cred,),
                              policy=Policy(), admins=())
            rows[f"assert {name}"] = _median_ms(
                lambda a=auth, c=cred, s=charter: assert_statement(a, c, s), n)
            proof = assert_statement(auth, cred, charter)
            rows[f"verify {name}"] = _median_ms(
                lambda c=cred, s=charter, p=proof: verify_proof(c, s, p, last_counter=0), n)

            def both(a=auth, c=cred, s=charter):
                verify_proof(c, s, assert_statement(a, c, s), last_counter=0)
            rows[f"assert+verify {name}"] = _median_ms(both, n)
            item = Signed(charter, (proof,)).encode()
            rows[f"verify_chain(charter) {name}"] = _median_ms(
                lambda i=item, k=swarm: verify_chain([i], swarm_pubkey=k.public_bytes, now=0), n)
            rows[f"size charter+proof {name} (bytes)"] = (len(item), len(item))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="repetitions per figure")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    rows = run(args.n)
    if args.json:
        print(json.dumps({k: {"median": v[0], "min": v[1]} for k, v in rows.items()}, indent=1))
        return
    print(f"{'figure':36} {'median':>10} {'min':>10}   (ms unless stated; n={args.n})")
    for key, (median, best) in rows.items():
        print(f"{key:36} {median:10.2f} {best:10.2f}")


if __name__ == "__main__":
    main()
