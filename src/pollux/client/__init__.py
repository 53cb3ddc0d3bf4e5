"""The client of a Pollux server: finds it (:mod:`~pollux.client.address`) and calls its
REST API (:mod:`~pollux.client.http`).

It stands alone: it imports the data directory's layout (:mod:`pollux.data_dir`) and
the wire contracts it shares with the server (:mod:`pollux.tokens`,
:mod:`pollux.unix_socket`, :mod:`pollux.server_proof`, :mod:`pollux.errors`), never the
server, so that ``pollux ls`` loads no scheduler, policy or web framework
(``tests/test_client_imports.py`` holds it to that).
"""

from __future__ import annotations

from pollux.client.address import ServerAddress, locate_server, server_address
from pollux.client.http import DEFAULT_TIMEOUT_S, PolluxClient

__all__ = ["DEFAULT_TIMEOUT_S", "PolluxClient", "ServerAddress", "locate_server",
           "server_address"]
