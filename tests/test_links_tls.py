"""TLS links: mutual authentication bound to peer keys, bad input, and a second process."""

from __future__ import annotations

import asyncio
import datetime
import ssl

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

from identity.keys import PeerKey
from swarm import wire
from swarm.errors import AuthenticationError, LinkClosed, ProtocolError
from swarm.links import LinkOptions, tls
from swarm.links.base import Goodbye
from swarm.links.echo import Bulk, Echo, Flush, Flushed
from tests.links_helpers import echo_peer


@wire.message("test.tls.note")
class Note(wire.Message):
    """A small message with an array."""

    text: str
    data: np.ndarray


A, B, C = PeerKey.generate(), PeerKey.generate(), PeerKey.generate()


async def _server(key=A, options=None, accept=lambda _: True):
    links: asyncio.Queue = asyncio.Queue()
    server = await tls.listen(key, on_link=links.put_nowait, accept=accept, options=options)
    return server, links


async def test_mutual_authentication_and_round_trip():
    server, links = await _server()
    async with server:
        dialer = await tls.connect(B, "127.0.0.1", server.port, expect=A.peer_id)
        listener = await asyncio.wait_for(links.get(), 5)
        assert dialer.kind == listener.kind == "tls"
        assert (dialer.remote, listener.remote) == (A.peer_id, B.peer_id)
        arr = np.random.default_rng(0).random((512, 512))
        await dialer.send(Note("hi", arr))
        got = await asyncio.wait_for(listener.recv(), 5)
        assert got.text == "hi" and np.array_equal(got.data, arr)
        assert 0 < await dialer.ping() < 1
        await dialer.close("done")
        exc = await asyncio.wait_for(listener.wait_closed(), 5)
        assert exc.reason == "closed by peer: done"


async def test_dialer_refuses_a_peer_that_is_not_the_expected_one():
    server, links = await _server(key=C)  # C answers where A was expected: a MITM
    async with server:
        with pytest.raises(AuthenticationError, match="not the expected"):
            await tls.connect(B, "127.0.0.1", server.port, expect=A.peer_id)


async def test_listener_refuses_a_blocked_peer_at_handshake():
    server, links = await _server(accept=lambda peer: peer != C.peer_id)
    async with server:
        with pytest.raises(AuthenticationError, match="refused the link.*not accepted"):
            await tls.connect(C, "127.0.0.1", server.port, expect=A.peer_id)
        ok = await tls.connect(B, "127.0.0.1", server.port, expect=A.peer_id)
        assert (await asyncio.wait_for(links.get(), 5)).remote == B.peer_id
        assert links.empty()
        await ok.close()


def _foreign_context() -> ssl.SSLContext:
    """A client presenting a self-signed cert outside the swarm's scheme."""
    import os
    import tempfile
    key = Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stranger")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(7)
            .not_valid_before(datetime.datetime(2020, 1, 1))
            .not_valid_after(datetime.datetime(2100, 1, 1)).sign(key, None))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    fd, path = tempfile.mkstemp()
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
                + cert.public_bytes(serialization.Encoding.PEM))
    ctx.load_cert_chain(path)
    os.unlink(path)
    return ctx


async def test_a_certificate_outside_the_scheme_is_refused():
    server, links = await _server()
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port,
                                                       ssl=_foreign_context())
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(1), 5)
        writer.close()
        assert links.empty()


async def _raw_client(port: int):
    """A TLS client with a valid certificate that then writes whatever it likes."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=tls.make_context(B, server=False), server_hostname="x")
    size = int.from_bytes(await reader.readexactly(4), "big")
    (welcome,) = wire.Decoder().feed(await reader.readexactly(size))
    assert isinstance(welcome, tls.Welcome)
    return reader, writer


async def _goodbye_reason(reader: asyncio.StreamReader) -> str:
    size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 5), "big")
    (bye,) = wire.Decoder().feed(await reader.readexactly(size))
    assert isinstance(bye, Goodbye)
    return bye.reason


@pytest.mark.parametrize(("payload", "match"), [
    (((4 << 30) - 1).to_bytes(4, "big"), "exceeds"),                    # claims 4 GiB
    (b"\x00\x00\x00\x05\x01\x01\xc1\xc1\xc1", "malformed header"),      # bad msgpack
    (b"\x00\x00\x00\x05\x01\x01\x93\x01\xa1", "malformed header"),      # truncated msgpack
    (b"\x00\x00\x00\x0c\x01\x02" + bytes(10), "not being received"),    # stray chunk
])
async def test_bad_frames_close_the_link_with_a_clear_error(payload, match):
    server, links = await _server()
    async with server:
        reader, writer = await _raw_client(server.port)
        link = await asyncio.wait_for(links.get(), 5)
        writer.write(payload)
        exc = await asyncio.wait_for(link.wait_closed(), 5)
        assert isinstance(exc.error, ProtocolError) and match in exc.reason
        assert match in await _goodbye_reason(reader)
        writer.close()
        # the listener carries on serving others
        ok = await tls.connect(C, "127.0.0.1", server.port, expect=A.peer_id)
        await ok.close()


async def test_half_a_frame_then_silence_closes_within_the_frame_timeout():
    server, links = await _server(options=LinkOptions(frame_timeout=0.3))
    async with server:
        reader, writer = await _raw_client(server.port)
        link = await asyncio.wait_for(links.get(), 5)
        frame = wire.encode(Note("x", np.zeros(10)))[0]
        writer.write(len(frame).to_bytes(4, "big") + frame[: len(frame) // 2])
        exc = await asyncio.wait_for(link.wait_closed(), 5)
        assert isinstance(exc.error, ProtocolError) and "stalled" in exc.reason
        writer.close()


async def test_two_processes_echo_and_bulk_counts():
    with echo_peer("tls") as (key, port, _):
        link = await tls.connect(B, "127.0.0.1", port, expect=key.peer_id)
        arr = np.arange(1_000_000, dtype=np.float32)
        await link.send(Echo("there and back", [arr, arr[:5]]))
        back = await asyncio.wait_for(link.recv(), 10)
        assert back.text == "there and back" and np.array_equal(back.arrays[0], arr)
        assert np.array_equal(back.arrays[1], arr[:5])
        for _ in range(5):
            await link.send(Bulk(np.ones(300_000, dtype=np.uint8)))
        await link.send(Flush(1))
        assert await asyncio.wait_for(link.recv(), 10) == Flushed(1, 5, 1_500_000)
        await link.close()


async def test_the_other_process_dying_closes_the_link():
    with echo_peer("tls") as (key, port, proc):
        link = await tls.connect(B, "127.0.0.1", port, expect=key.peer_id)
        proc.kill()
        exc = await asyncio.wait_for(link.wait_closed(), 10)
        assert "connection lost" in exc.reason
        with pytest.raises(LinkClosed):
            await link.recv()


async def test_a_receiver_that_does_not_read_stops_the_sender(monkeypatch):
    monkeypatch.setenv("SWARM_SHM", "0")  # TLS's own flow control (shared memory: test_links_shm)
    server, links = await _server(options=LinkOptions(recv_queue=1, frame_timeout=0.3))
    async with server:
        link = await tls.connect(B, "127.0.0.1", server.port, expect=A.peer_id)
        slow = await asyncio.wait_for(links.get(), 5)
        blob = np.zeros(1 << 20, dtype=np.uint8)

        async def send_all():
            for _ in range(64):
                await link.send(Note("x", blob))

        sender = asyncio.create_task(send_all())

        async def blocked():
            while link._stream.transport.get_write_buffer_size() < wire.MAX_FRAME:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(blocked(), 10)
        await asyncio.sleep(0.6)  # two frame timeouts: our pause is no stalled peer
        assert not sender.done() and not slow.closed
        assert link.stats().bytes_sent < 48 << 20  # kernel buffers, not all 64 MiB
        for _ in range(64):
            assert (await asyncio.wait_for(slow.recv(), 10)).data.nbytes == 1 << 20
        await asyncio.wait_for(sender, 10)
        await link.close()


async def test_received_arrays_are_decrypted_straight_into_place(monkeypatch):
    """Chunk data is written by the TLS layer into the array being received: no staging
    copy, no reassembly copy (the link's counter says how much went so)."""
    monkeypatch.setenv("SWARM_SHM", "0")
    server, links = await _server()
    async with server:
        link = await tls.connect(B, "127.0.0.1", server.port, expect=A.peer_id)
        far = await asyncio.wait_for(links.get(), 5)
        sent = [np.random.default_rng(i).random(300_000) for i in range(4)]  # 2.4 MB each
        for x in sent:
            await link.send(Note("x", x))
        for x in sent:
            got = await asyncio.wait_for(far.recv(), 10)
            np.testing.assert_array_equal(got.data, x)
        chunk = wire.CHUNK_SIZE
        big = sum(x.nbytes // chunk * chunk for x in sent)  # full-size chunks
        assert far._stream.landed >= big
        assert far.stats().bytes_received >= sum(x.nbytes for x in sent)
        await link.close()


@pytest.mark.parametrize(("frame", "match"), [
    (bytes((1, 2)) + bytes(10) + bytes(200_000), "not being received"),  # a stray big chunk
    (bytes((1, 1)) + b"\xc1" * 200_000, "malformed header"),  # a big bad header
])
async def test_a_bad_large_frame_closes_the_link_with_a_clear_error(frame, match):
    server, links = await _server()
    async with server:
        reader, writer = await _raw_client(server.port)
        link = await asyncio.wait_for(links.get(), 5)
        writer.write(len(frame).to_bytes(4, "big") + frame)
        exc = await asyncio.wait_for(link.wait_closed(), 5)
        assert isinstance(exc.error, ProtocolError) and match in exc.reason
        writer.close()


async def test_half_a_large_chunk_then_silence_closes_within_the_frame_timeout(monkeypatch):
    """The part of a chunk already written into the array does not keep the link waiting."""
    monkeypatch.setenv("SWARM_SHM", "0")
    server, links = await _server(options=LinkOptions(frame_timeout=0.3))
    async with server:
        reader, writer = await _raw_client(server.port)
        link = await asyncio.wait_for(links.get(), 5)
        header, chunk, *_ = map(bytes, wire.encode(Note("x", np.zeros(100_000))))
        for frame in (header, chunk[: len(chunk) // 2]):
            writer.write(len(chunk if frame is not header else header).to_bytes(4, "big")
                         + frame)
        exc = await asyncio.wait_for(link.wait_closed(), 5)
        assert isinstance(exc.error, ProtocolError) and "stalled" in exc.reason
        assert link._stream.landed == len(chunk) - wire.CHUNK_HEAD  # it had begun in place
        writer.close()
