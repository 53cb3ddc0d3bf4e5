"""Running the scheduler service as a process: the data-directory lock, the HTTP server
(uvicorn) with the allocation loop, ``server.json`` for clients, and a graceful shutdown
on SIGINT/SIGTERM."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from pollux.data_dir import LOCK_FILE, SERVER_FILE, SOCKET_FILE, TOKEN_FILE
from pollux.errors import ConfigError, PolluxError, StartupError
from pollux.service.config import ServerConfig
from pollux.service.http.local_socket import bind_local_socket, share_local_socket
from pollux.service.private import make_private_dir, make_private_file, new_token
from pollux.service.server import build_service

logger = logging.getLogger(__name__)

NOISY_LOGGERS = ("uvicorn.error", "uvicorn", "asyncio")
"""Loggers whose repeated records are held back to one per cause a minute (a flood of
bad connections must not flood the log)."""


class ServerShutdown(BaseException):  # noqa: N818 - a signal, not an error
    """Raised by the SIGTERM/SIGINT handler to unwind into a graceful shutdown."""


def unwritable(path: Path, what: str, exc: OSError) -> StartupError:
    """The one-line start-up error of an OSError on ``path``, with the fix for its cause."""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = f"free space in {path.parent} (or give another --data-dir) and start again"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        fix = ("give --data-dir a directory this user can write (the data directory holds "
               "the job store, the lock and the token)")
    else:
        fix = "fix the path or give another --data-dir, and start again"
    return StartupError(path, f"cannot {what} ({reason})", fix)


@contextmanager
def data_dir_lock(data_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on the data directory (one server per directory). A new
    directory is private to the user: the job store holds the jobs' hints tokens."""
    lock = data_dir / LOCK_FILE
    try:
        make_private_dir(data_dir)
    except OSError as exc:
        raise unwritable(data_dir, "create the data directory", exc) from exc
    try:
        make_private_file(lock)
        handle = open(lock, "w")  # noqa: SIM115 - held for the lifetime
    except OSError as exc:
        raise unwritable(lock, "create the lock file", exc) from exc
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ConfigError("data_dir", str(data_dir),
                              "another pollux server uses it; stop it or pick another "
                              "--data-dir") from exc
        yield
    finally:
        handle.close()


def write_server_file(config: ServerConfig, url: str) -> None:
    path = config.data_dir / SERVER_FILE
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    make_private_file(tmp)
    tmp.write_text(json.dumps({"url": url, "socket": str(config.data_dir / SOCKET_FILE),
                               "machine": socket.gethostname(),
                               "pid": os.getpid(), "token_file": config.http.token_file,
                               "has_token": bool(config.http.token),
                               "tls_cert": config.tls.cert}))
    os.replace(tmp, path)


def run_server(config: ServerConfig, ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGINT/SIGTERM, then checkpoint-and-stop every job and return."""
    import uvicorn

    from pollux.service.http.api import create_app
    from pollux.service.http.auth import ApiAuth, allowed_hosts_for, is_loopback
    from pollux.service.http.connections import (
        ACCEPT_BACKLOG,
        LISTEN_BACKLOG,
        OncePerCause,
        connection_limits,
        deepen_backlog,
        guarded_protocol,
        server_tls_context,
    )

    with data_dir_lock(config.data_dir):
        if not config.http.token:  # a token always: a new one at every start, in the data dir
            try:
                token, token_path = new_token(config.data_dir)
            except OSError as exc:  # e.g. a full disk: leave no half-written token behind
                (config.data_dir / f"{TOKEN_FILE}.tmp").unlink(missing_ok=True)
                raise unwritable(config.data_dir / TOKEN_FILE, "write the API token",
                                 exc) from exc
            config = replace(config, http=replace(config.http, token=token,
                                                       token_file=str(token_path)))
        sock = socket.socket(socket.AF_INET6 if ":" in config.http.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((config.http.host, config.http.port))
            # Listen now, so that clients reading server.json queue in the backlog instead of
            # being refused until uvicorn's event loop starts accepting.
            sock.listen(LISTEN_BACKLOG)
        except OSError as exc:
            raise ConfigError("port", config.http.port, f"cannot bind {config.http.host}: {exc}") from exc
        port = sock.getsockname()[1]
        local_sock = bind_local_socket(config.data_dir)  # the local CLI's way in
        local_host = "127.0.0.1" if config.http.host in ("0.0.0.0", "::", "localhost") else config.http.host
        scheme = "https" if config.tls.cert else "http"
        url = f"{scheme}://{local_host}:{port}"
        if not config.tls.cert and not is_loopback(config.http.host):
            logger.warning("serving plain HTTP on %s: the token and job specs cross the "
                           "network readable; pass --tls-cert and --tls-key", config.http.host)
        advertised = config.http.advertise_host
        if advertised and ":" in advertised:
            advertised = f"[{advertised}]"  # IPv6
        hints_base = f"{scheme}://{advertised}:{port}" if advertised else url
        try:
            service = build_service(config, f"{hints_base}/api/jobs/{{job_id}}/hints")
        except BaseException:  # e.g. a damaged store: nothing listens, nothing is left
            sock.close()
            local_sock.close()
            (config.data_dir / SOCKET_FILE).unlink(missing_ok=True)
            raise
        assert config.http.token is not None
        share_local_socket(config.data_dir, service.users.count() > 0)
        app = create_app(service, ApiAuth(config.http.token, allowed_hosts_for(
            config.http.host, config.http.advertise_host), secure_cookie=bool(config.tls.cert),
            port=port))
        app.state.url = url  # the dashboard link of users who reach only the socket
        limits = connection_limits()
        tls = (None if config.tls.cert is None or config.tls.key is None
               else server_tls_context(config.tls.cert, config.tls.key))
        protocol, _ = guarded_protocol(limits, tls)  # the guard does TLS: handshakes counted
        server = deepen_backlog(uvicorn.Server)(uvicorn.Config(
            app, log_level="warning", access_log=False, http=protocol,  # type: ignore[arg-type]
            backlog=ACCEPT_BACKLOG,
            timeout_keep_alive=int(limits.keep_alive_s)))
        quiet = OncePerCause()
        noisy = [logging.getLogger(name) for name in NOISY_LOGGERS]
        for noisy_logger in noisy:
            noisy_logger.addFilter(quiet)

        def request_shutdown(signum: int, frame: object) -> None:
            raise ServerShutdown(signum)

        previous = {sig: signal.signal(sig, request_shutdown)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            service.start()
            try:
                write_server_file(config, url)
            except OSError as exc:
                raise unwritable(config.data_dir / SERVER_FILE, "write the server file",
                                 exc) from exc
            logger.info("pollux server on %s (policy %s, data %s)", url, config.policy.spec,
                        config.data_dir)
            if ready is not None:
                ready(url)
            server.run(sockets=[sock, local_sock])
        except ServerShutdown:
            pass
        finally:
            (config.data_dir / SERVER_FILE).unlink(missing_ok=True)
            (config.data_dir / SOCKET_FILE).unlink(missing_ok=True)
            for sig in previous:
                signal.signal(sig, signal.SIG_IGN)
            try:
                service.shutdown(config.loop.stop_grace_s)
            except PolluxError:
                logger.exception("shutdown did not complete")
            finally:
                service.store.close()
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                for noisy_logger in noisy:
                    noisy_logger.removeFilter(quiet)
