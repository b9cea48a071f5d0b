"""UDP helpers run inside test hosts: ``reflect PORT...`` answers every datagram with the
sender's address as seen ("ip:port"); ``probe HOST PORT...`` sends from one socket to each
port and prints the addresses the reflector saw, one per line (bounded waits throughout)."""

from __future__ import annotations

import selectors
import socket
import sys


def reflect(ports: list[int], seconds: float) -> None:
    sel = selectors.DefaultSelector()
    for port in ports:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("0.0.0.0", port))
        sel.register(s, selectors.EVENT_READ)
    print("ready", flush=True)
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.5):
            sock = key.fileobj
            data, addr = sock.recvfrom(2048)
            sock.sendto(f"{addr[0]}:{addr[1]}".encode(), addr)


def probe(host: str, ports: list[int]) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 0))
    s.settimeout(2.0)
    print(f"local {s.getsockname()[1]}")
    for port in ports:
        for _ in range(5):
            s.sendto(b"?", (host, port))
            try:
                print(s.recv(2048).decode(), flush=True)
                break
            except TimeoutError:
                continue
        else:
            print("timeout", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "reflect":
        reflect([int(p) for p in sys.argv[2:]], 60.0)
    else:
        probe(sys.argv[2], [int(p) for p in sys.argv[3:]])
