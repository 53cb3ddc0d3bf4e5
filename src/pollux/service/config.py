"""The scheduler service's configuration: nested frozen dataclasses, one per concern
(HTTP, TLS, policy, allocation loop, backend, job store, autoscaling), each field with
the help text of the ``pollux server`` flag that sets it (:mod:`pollux.options`; the
CLI builds its flags from these fields, :mod:`pollux.cli.config_flags`). Each section
checks its own bounds when built; a bad value raises :class:`~pollux.errors.ConfigError`
naming the field and the fix."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from pollux.backends.local_options import LocalOptions
from pollux.backends.ray.options import RayOptions
from pollux.backends.registry import backend_names
from pollux.backends.replica_log import DEFAULT_LOG_BUDGET_BYTES, check_log_budget
from pollux.backends.slurm.options import SlurmOptions
from pollux.cluster_spec import parse_cluster_spec, parse_type_speeds
from pollux.data_dir import default_data_dir
from pollux.errors import ConfigError
from pollux.job_spec import parse_memory
from pollux.options import changed_flag, option, section
from pollux.policies.autoscaling import (
    DEFAULT_NODE_PRICE_PER_HOUR,
    NodePrices,
    autoscaler_names,
    check_autoscaler_name,
    parse_node_prices,
)
from pollux.service.loop.retention import Retention

DEFAULT_PORT = 8470


def _absolute(path: str) -> str:
    return str(Path(path).resolve())


def log_budget(text: str) -> int:
    """``--log-budget``'s bytes: a number of bytes or a size such as ``64MiB``."""
    try:
        return int(parse_memory(text, "--log-budget"))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.fix) from None


@dataclass(frozen=True)
class HttpConfig:
    """Where the REST API listens, and the token every request must carry."""

    host: str = option("127.0.0.1", flag="--host",
                       help="address to bind; beyond loopback a token is required")
    port: int = option(DEFAULT_PORT, flag="--port", type=int,
                       help="port to bind; 0 picks a free one (default: %(default)s)")
    token_file: str | None = option(
        None, flag="--token-file", metavar="FILE", convert=_absolute,
        help="require the bearer token stored in FILE (mode 0600); or set $POLLUX_TOKEN; "
             "default: one generated into the data dir")
    token: str | None = option(
        None, help="the bearer token: read from --token-file or $POLLUX_TOKEN (never from "
                   "the command line); None: the one in <data dir>/token, generated at "
                   "start (mode 0600)")
    advertise_host: str | None = option(
        None, flag="--advertise-address", metavar="HOST",
        help="address replicas on other machines use to reach this server (hints); "
             "default: the bound address (127.0.0.1 for 0.0.0.0)")

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError("port", self.port, "must be in 0..65535")


@dataclass(frozen=True)
class TlsConfig:
    """HTTPS: both files or neither."""

    cert: str | None = option(
        None, flag="--tls-cert", metavar="PEM", convert=_absolute,
        help="serve HTTPS with this certificate (chain); with --tls-key. Use it whenever "
             "--host is not loopback")
    key: str | None = option(None, flag="--tls-key", metavar="PEM", convert=_absolute,
                             help="private key of --tls-cert")

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ConfigError("tls_cert" if self.cert is None else "tls_key", None,
                              "give both --tls-cert and --tls-key")
        for name, path in (("tls_cert", self.cert), ("tls_key", self.key)):
            if path is not None and not os.access(path, os.R_OK):
                raise ConfigError(name, path, "no such readable file")


@dataclass(frozen=True)
class PolicyConfig:
    """The scheduling policy and what it knows of GPU types."""

    spec: str = option(
        "pollux", flag="--policy",
        help="policy spec: NAME or NAME(key=value,...), e.g. 'pollux(p=-0.5)' (`pollux "
             "policies` lists them; default: %(default)s)")
    gpu_type_speeds: str | None = option(
        None, flag="--gpu-type-speeds", metavar="TYPE=SPEED,...",
        help="relative speed of one GPU of each type, e.g. t4=1,a100=6.9: projects a job's "
             "model onto types it has not run on (types not given are learned from jobs "
             "that ran on several)")

    def __post_init__(self) -> None:
        if self.gpu_type_speeds is not None:
            parse_type_speeds(self.gpu_type_speeds, "--gpu-type-speeds")

    def type_speeds(self) -> dict[str, float]:
        """``gpu_type_speeds`` parsed (empty when not given)."""
        if self.gpu_type_speeds is None:
            return {}
        return parse_type_speeds(self.gpu_type_speeds, "--gpu-type-speeds")


@dataclass(frozen=True)
class LoopConfig:
    """The allocation loop's clock."""

    interval_s: float = option(30.0, flag="--interval", type=float,
                               help="seconds between scheduling rounds (default: %(default)s)")
    stop_grace_s: float = option(
        60.0, flag="--stop-grace", type=float,
        help="seconds replicas get to checkpoint after SIGTERM (default: %(default)s)")
    poll_interval_s: float = option(
        0.5, help="internal, no flag: seconds between the loop's polls of the replicas")

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ConfigError("interval", self.interval_s, "must be > 0 seconds")


@dataclass(frozen=True)
class BackendConfig:
    """Where replicas run; each backend declares its own options (a section each)."""

    name: str = option("local", flag="--backend", choices=backend_names,
                       help="where replicas run (default: %(default)s)")
    log_budget_bytes: int = option(
        DEFAULT_LOG_BUDGET_BYTES, flag="--log-budget", type=log_budget, metavar="SIZE",
        help="local, ray and slurm backends: most bytes each replica's log keeps (the newest "
             "output; the rest rotated away), e.g. 256MiB (default: "
             f"{DEFAULT_LOG_BUDGET_BYTES >> 20}MiB)")
    local: LocalOptions = section(LocalOptions, "local backend")
    ray: RayOptions = section(RayOptions, "ray backend")
    slurm: SlurmOptions = section(SlurmOptions, "slurm backend")

    def __post_init__(self) -> None:
        for backend, options in (("ray", self.ray), ("slurm", self.slurm)):
            flag = changed_flag(options)
            if self.name != backend and flag is not None:
                raise ConfigError("backend", self.name, f"{flag} needs --backend {backend}")
        if self.local.virtual_nodes is not None:
            if self.name != "local":
                raise ConfigError("virtual_nodes", self.local.virtual_nodes,
                                  "typed virtual nodes need --backend local (a Ray node "
                                  "declares its type with an accelerator_type:<T> resource)")
            parse_cluster_spec(self.local.virtual_nodes, field="virtual_nodes")
        try:
            check_log_budget(self.log_budget_bytes)
        except ValueError as exc:
            raise ConfigError("log_budget", self.log_budget_bytes, str(exc)) from None

    def options(self) -> dict[str, object]:
        """The keyword options of the backend class ``name`` (but its instance id)."""
        if self.name == "local":
            kwargs = self.local.backend_kwargs()
        elif self.name == "ray":
            kwargs = self.ray.backend_kwargs()
        elif self.name == "slurm":
            kwargs = self.slurm.backend_kwargs()
        else:
            return {}
        return {**kwargs, "log_budget_bytes": self.log_budget_bytes}


@dataclass(frozen=True)
class StoreConfig:
    """How long finished jobs stay, and recovery of a lost job store."""

    keep_finished: int = option(
        Retention.keep_count, flag="--keep-finished", type=int, metavar="N",
        help="finished jobs kept, the newest; older ones are pruned with their "
             "checkpoints and logs (default: %(default)s)")
    keep_finished_days: float = option(
        Retention.keep_s / 86_400.0, flag="--keep-finished-days", type=float,
        metavar="DAYS",
        help="finished jobs are pruned with their files this many days after they "
             "finished (default: %(default)s)")
    recover: bool = option(
        False, flag="--recover", store_true=True,
        help="the job store was lost or damaged: set it aside, restore its newest backup "
             "(<data dir>/backups) and move the directories of jobs it lacks to <data "
             "dir>/lost, then start")

    def __post_init__(self) -> None:
        self.retention()  # checks the bounds

    def retention(self) -> Retention:
        return Retention(keep_count=self.keep_finished,
                         keep_s=self.keep_finished_days * 86_400.0)


def _autoscaler_metavar() -> str:
    return "{" + ",".join(autoscaler_names()) + "}"


@dataclass(frozen=True)
class AutoscalingConfig:
    """The desired cluster size computed every round and passed to the backend's
    ``request_cluster_size``."""

    name: str = option(
        "none", flag="--autoscaler", metavar=_autoscaler_metavar,
        help="compute the desired cluster size every round and pass it to the backend: "
             "pollux (goodput-aware), throughput, or none (default)")
    min_nodes: int = option(1, flag="--min-nodes", type=int,
                            help="autoscaling: fewest nodes (default: %(default)s)")
    max_nodes: int | None = option(None, flag="--max-nodes", type=int,
                                   help="autoscaling: most nodes (default: the nodes at "
                                        "startup)")
    node_price_per_hour: NodePrices = option(
        DEFAULT_NODE_PRICE_PER_HOUR, flag="--node-price", type=parse_node_prices,
        help="autoscaling: price of a node-hour, one for every GPU type or TYPE=PRICE,... "
             "(on nodes of several types each type is sized by goodput per dollar; "
             "default: %(default)s)")

    def __post_init__(self) -> None:
        check_autoscaler_name(self.name)


def _resolved_dir(path: str) -> Path:
    return Path(path).expanduser().resolve()


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``pollux server`` is told: the data directory and one section per
    concern."""

    data_dir: Path = option(
        flag="--data-dir", convert=_resolved_dir,
        flag_default=lambda: str(default_data_dir()),
        help="job store, checkpoints and logs (default: %(default)s)")
    teams_file: str | None = option(
        None, flag="--teams", metavar="FILE", convert=_absolute,
        help="teams file (YAML): each team's GPU quota, weight and Slurm account; jobs go "
             "into one of their owner's teams")
    http: HttpConfig = section(HttpConfig, "HTTP API")
    tls: TlsConfig = section(TlsConfig, "TLS")
    policy: PolicyConfig = section(PolicyConfig, "policy")
    loop: LoopConfig = section(LoopConfig, "allocation loop")
    backend: BackendConfig = section(BackendConfig, "backend")
    store: StoreConfig = section(StoreConfig, "job store")
    autoscaling: AutoscalingConfig = section(AutoscalingConfig, "cloud autoscaling")
