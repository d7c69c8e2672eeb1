"""The stack's listening ports are picked below the kernel's ephemeral range, where no outgoing
connection can take them between the pick and the server's bind."""

from __future__ import annotations

import socket
from pathlib import Path

from mvlog.infra.local_stack import LOOPBACK, PORT_FLOOR, ephemeral_ports, free_ports


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low, _ = ephemeral_ports()
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(PORT_FLOOR <= port < low for port in ports)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, port))


def test_the_range_is_read_from_the_kernel_or_defaults(tmp_path: Path) -> None:
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("40000\t50000\n")
    assert ephemeral_ports(setting) == (40000, 50000)
    assert ephemeral_ports(tmp_path / "missing") == (32768, 60999)
