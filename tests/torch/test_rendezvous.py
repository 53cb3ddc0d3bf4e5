"""The rendezvous store of a local job listens on loopback only (issue #13 item 7)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pollux.torch.distributed import loopback_listener, rendezvous_store


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp* writes them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, _, port_hex = fields[1].partition(":")
            if int(port_hex, 16) == port and fields[3] == "0A":  # LISTEN
                found.add(address)
    return found


def test_the_store_of_a_loopback_master_listens_on_loopback_only():
    probe = loopback_listener("127.0.0.1", 0)
    assert probe is not None
    port = probe.getsockname()[1]
    probe.close()
    store = rendezvous_store("127.0.0.1", port, 0, 1, timedelta(seconds=10))
    store.set("k", "v")
    assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1, not 0.0.0.0 or ::
    del store


def test_other_masters_are_left_to_torch():
    assert loopback_listener("10.1.2.3", 0) is None
    assert loopback_listener("head-node", 0) is None
