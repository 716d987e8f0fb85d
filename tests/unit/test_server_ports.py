"""Server ports come from below the kernel's ephemeral range, so no client's outgoing connection can hold one while
the server starts (a /health poll that self-connects to the port makes uvicorn's bind fail with exit code 3)."""

import socket

from sglang_dspark.bench import server


def test_ports_are_below_the_ephemeral_range_and_free():
    low = server._ephemeral_low()
    ports = {server.free_port() for _ in range(20)}
    assert all(server.PORT_RANGE[0] <= p < min(low, server.PORT_RANGE[1] + 1) for p in ports), ports
    assert len(ports) > 1  # random picks, so two servers started back to back do not race for one port
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_taken_port_is_skipped(monkeypatch):
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(server, "PORT_RANGE", (taken, taken + 1))
        monkeypatch.setattr(server, "_ephemeral_low", lambda: 65536)
        assert server.free_port() == taken + 1
