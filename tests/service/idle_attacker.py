"""A hostile client for the connection tests, run as its own process:
``python idle_attacker.py HOST PORT NUM SECONDS [REOPEN_PER_S]``. Holds NUM connections
to the server for SECONDS: half never send a byte, half send a request's headers one
byte a second and never finish them; a connection the server closes is opened again
(at most REOPEN_PER_S a second once all NUM were opened; default 100).
Prints one JSON line at the end: connections opened, and the most held at once."""

from __future__ import annotations

import json
import resource
import select
import socket
import sys
import time

PARTIAL = b"GET /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4096


def main() -> None:
    host, port, num, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    reopen_per_s = float(sys.argv[5]) if len(sys.argv) > 5 else 100.0
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, num + 256), hard))
    held: dict[socket.socket, int] = {}  # socket -> bytes of PARTIAL sent (-1: idle one)
    opened = most = 0
    deadline = time.monotonic() + seconds
    last_drip = 0.0
    started = time.monotonic()
    while time.monotonic() < deadline:
        allowed = num + reopen_per_s * (time.monotonic() - started)
        while len(held) < num and opened < allowed and time.monotonic() < deadline:
            sock = socket.socket()
            sock.settimeout(0.2)
            try:
                sock.connect((host, port))
            except OSError:
                sock.close()
                break  # the server's queue is full: look at the others first
            sock.setblocking(False)
            held[sock] = -1 if opened % 2 == 0 else 0
            opened += 1
        most = max(most, len(held))
        poller = select.poll()
        by_fd = {sock.fileno(): sock for sock in held}
        for fd in by_fd:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        for fd, _ in poller.poll(50):
            sock = by_fd[fd]
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            if not data:  # closed by the server: open another one
                held.pop(sock, None)
                sock.close()
        if time.monotonic() - last_drip >= 1.0:
            last_drip = time.monotonic()
            for sock, sent in list(held.items()):
                if 0 <= sent < len(PARTIAL):
                    try:
                        sock.send(PARTIAL[sent:sent + 1])
                        held[sock] = sent + 1
                    except OSError:
                        held.pop(sock, None)
                        sock.close()
    print(json.dumps({"opened": opened, "most_held": most}), flush=True)


if __name__ == "__main__":
    main()
