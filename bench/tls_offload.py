"""TLS record work off the event-loop thread: what CPython's GIL makes of it.

    python bench/tls_offload.py [--mb 64] [--repeats 3] [--json]

Why: issue 17 asked to move the direct links' TLS record work off the loop thread. In
CPython (3.11, with the GIL) a thread that decrypts with ``SSLObject.read`` gets one record
(16 KiB) per call and must take the GIL back after every record; while the loop thread runs
Python it gets it once per switch interval (5 ms). This measures that, on the link's own
TLS 1.3 contexts (two ``SSLObject``s over memory BIOs, no sockets):

- ``receive``: decrypt ``--mb`` of records into one buffer, ``read(n, buffer)`` per record;
- ``send``: encrypt ``--mb`` in 4 MiB ``write`` calls (one GIL release each), taking the
  records out of the BIO;

each on the calling thread (as the links do today), in a second thread while the first
sleeps, and in a second thread while the first runs Python (a busy event loop). ``loop's
pace`` is how fast the first thread's Python ran meanwhile, against running alone.
"""

from __future__ import annotations

import argparse
import json
import ssl
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from identity.keys import PeerKey  # noqa: E402
from swarm.links.tls import make_context  # noqa: E402

CHUNK = 4 << 20


class Pair:
    """A connected client/server pair of SSLObjects over memory BIOs."""

    def __init__(self) -> None:
        self.c_in, self.c_out, self.s_in, self.s_out = (ssl.MemoryBIO() for _ in range(4))
        self.client = make_context(PeerKey.generate(), server=False).wrap_bio(
            self.c_in, self.c_out, server_side=False, server_hostname="peer")
        self.server = make_context(PeerKey.generate(), server=True).wrap_bio(
            self.s_in, self.s_out, server_side=True)
        for _ in range(8):
            for end in (self.client, self.server):
                try:
                    end.do_handshake()
                except ssl.SSLWantReadError:
                    pass
            self.s_in.write(self.c_out.read())
            self.c_in.write(self.s_out.read())
        self.client.do_handshake()  # raises unless both ends are done

    def encrypt(self, data: memoryview) -> int:
        """Client side: records for ``data``, taken out of the BIO (what a send does)."""
        out = 0
        for at in range(0, len(data), CHUNK):
            self.client.write(data[at:at + CHUNK])
            out += len(self.c_out.read())
        return out

    def deliver(self, data: memoryview) -> None:
        """Encrypt ``data`` and hand the records to the server (untimed)."""
        for at in range(0, len(data), CHUNK):
            self.client.write(data[at:at + CHUNK])
            self.s_in.write(self.c_out.read())

    def decrypt(self, into: memoryview) -> int:
        """Server side: records into ``into``, one ``read`` per record; the calls made."""
        got = calls = 0
        while got < len(into):
            got += self.server.read(len(into) - got, into[got:])
            calls += 1
        return calls


def python_rate(seconds: float = 0.2) -> float:
    """Iterations per second of the busy loop, alone."""
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            n += 1
    return n / seconds


def timed(work: Callable[[], object], where: str) -> tuple[float, float | None]:
    """Seconds ``work`` took, and the calling thread's Python pace meanwhile (threaded)."""
    if where == "loop thread":
        t = time.perf_counter()
        work()
        return time.perf_counter() - t, None
    th = threading.Thread(target=work)
    n = 0
    t = time.perf_counter()
    th.start()
    if where == "thread, loop idle":
        th.join()
    else:
        while th.is_alive():
            for _ in range(1000):
                n += 1
        th.join()
    dt = time.perf_counter() - t
    return dt, (n / dt if where == "thread, loop busy" else None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=64, help="MiB per measurement (default 64)")
    p.add_argument("--repeats", type=int, default=3, help="medians of this many (default 3)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args()
    size = args.mb << 20
    plain = memoryview(bytes(size))
    into = memoryview(bytearray(size))
    pair = Pair()
    alone = python_rate()
    rows = []
    for what in ("receive", "send"):
        for where in ("loop thread", "thread, loop idle", "thread, loop busy"):
            secs, paces = [], []
            for _ in range(args.repeats):
                if what == "receive":
                    pair.deliver(plain)
                    dt, pace = timed(lambda: pair.decrypt(into), where)
                else:
                    dt, pace = timed(lambda: pair.encrypt(plain), where)
                secs.append(dt)
                if pace is not None:
                    paces.append(pace / alone)
            rows.append({"work": what, "where": where,
                         "mb_s": round(size / statistics.median(secs) / 1e6),
                         "loop_pace": round(statistics.median(paces), 2) if paces else None})
    out = {"rows": rows, "meta": {"mb": args.mb, "repeats": args.repeats,
                                  "switch_interval_ms": sys.getswitchinterval() * 1e3,
                                  "python": sys.version.split()[0],
                                  "openssl": ssl.OPENSSL_VERSION}}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{'work':8s} {'where':20s} {'MB/s':>7s} {'loop pace':>10s}")
    for r in rows:
        pace = "" if r["loop_pace"] is None else f"{r['loop_pace']:.2f}"
        print(f"{r['work']:8s} {r['where']:20s} {r['mb_s']:7d} {pace:>10s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
