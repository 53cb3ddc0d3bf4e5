"""``pollux server``: run the scheduler service (job store, REST API, allocation loop).

Binds 127.0.0.1 by default. Every request must carry the token: the one in
``--token-file`` (mode 0600) or ``$POLLUX_TOKEN``, else one generated into
``<data dir>/token`` (which the CLI reads by itself); never on the command line, which
every local user can read (``--token`` is refused). Beyond loopback, serve HTTPS
(``--tls-cert``, ``--tls-key``). Ctrl-C (or SIGTERM) asks every running job to checkpoint and stop; a
restart on the same ``--data-dir`` resumes them. With ``--backend ray`` the replicas run
as Ray actors on the Ray cluster at ``--ray-address`` (or on a local Ray instance the
server starts).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pollux.backends.registry import backend_names
from pollux.data_dir import TOKEN_FILE, default_data_dir
from pollux.errors import ConfigError
from pollux.job_spec import parse_memory
from pollux.policies.autoscaling import autoscaler_names
from pollux.service.runner import run_server
from pollux.service.server import ServerConfig
from pollux.tokens import argv_token_refused, read_token_file, token_from_environment

CONFIG_FLAGS: Mapping[str, str] = MappingProxyType({
    "data_dir": "--data-dir", "host": "--host", "port": "--port",
    "token_file": "--token-file", "tls_cert": "--tls-cert", "tls_key": "--tls-key",
    "policy": "--policy", "interval_s": "--interval",
    "backend": "--backend", "num_nodes": "--nodes", "slots_per_node": "--slots-per-node",
    "virtual_nodes": "--virtual-nodes", "gpu_type_speeds": "--gpu-type-speeds",
    "device": "--device", "stop_grace_s": "--stop-grace",
    "advertise_host": "--advertise-address", "autoscaler": "--autoscaler",
    "min_nodes": "--min-nodes", "max_nodes": "--max-nodes",
    "node_price_per_hour": "--node-price",
    "keep_finished": "--keep-finished", "keep_finished_days": "--keep-finished-days",
    "recover": "--recover", "log_budget_bytes": "--log-budget", "teams_file": "--teams",
})
"""ServerConfig field -> the flag that sets it (a test checks every field is here or in
NOT_FLAGS, and that each flag's default is the field's)."""
NOT_FLAGS: Mapping[str, str] = MappingProxyType({
    "backend_options": "built from the --ray-* and --slurm-* flags",
    "token": "from --token-file or $POLLUX_TOKEN, never from the command line",
    "poll_interval_s": "internal: how often the loop polls replicas",
})


def config_default(name: str) -> Any:
    """ServerConfig's default for field ``name`` (the flag's default)."""
    found = {f.name: f for f in fields(ServerConfig)}[name]
    return found.default


def backend_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The backend's own options (the local backend's come from --nodes etc.)."""
    ray_flags = {"--ray-address": args.ray_address is not None,
                 "--ray-slot-resource": args.ray_slot_resource is not None,
                 "--ray-autoscale": args.ray_autoscale,
                 "--ray-gpu-type-prefix": args.ray_gpu_type_prefix is not None}
    slurm_flags = {"--slurm-partition": args.slurm_partition, "--slurm-account":
                   args.slurm_account, "--slurm-nodes": args.slurm_nodes,
                   "--slurm-mode": args.slurm_mode}
    for backend, flags in (("ray", ray_flags), ("slurm", slurm_flags)):
        if args.backend != backend:
            for flag, given in flags.items():
                if given:
                    raise ConfigError("backend", args.backend,
                                      f"{flag} needs --backend {backend}")
    if args.backend == "slurm":
        return {"partition": args.slurm_partition, "account": args.slurm_account,
                "nodes": args.slurm_nodes, "mode": args.slurm_mode}
    if args.backend != "ray":
        return {}
    return {"address": args.ray_address, "slot_resource": args.ray_slot_resource or "auto",
            "autoscale": args.ray_autoscale,
            **({} if args.ray_gpu_type_prefix is None
               else {"gpu_type_prefix": args.ray_gpu_type_prefix})}


def log_budget(text: str) -> int:
    """``--log-budget``'s bytes: a number of bytes or a size such as ``64MiB``."""
    try:
        return int(parse_memory(text, "--log-budget"))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.fix) from None


def token_from_args(args: argparse.Namespace) -> str | None:
    """The token of ``--token-file``, else of ``$POLLUX_TOKEN`` (then removed from this
    process's environment); a token on the command line is refused."""
    if args.token is not None:
        raise argv_token_refused()
    from_env = token_from_environment(remove=True)
    return read_token_file(args.token_file) if args.token_file is not None else from_env


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    token = token_from_args(args)
    return ServerConfig(
        data_dir=Path(args.data_dir).expanduser().resolve(), host=args.host, port=args.port,
        token=token, token_file=(None if args.token_file is None
                                 else str(Path(args.token_file).resolve())),
        policy=args.policy, interval_s=args.interval, backend=args.backend,
        num_nodes=args.nodes, slots_per_node=args.slots_per_node,
        virtual_nodes=args.virtual_nodes, gpu_type_speeds=args.gpu_type_speeds,
        device=args.device,
        stop_grace_s=args.stop_grace, backend_options=backend_options_from_args(args),
        advertise_host=args.advertise_address, autoscaler=args.autoscaler,
        min_nodes=args.min_nodes, max_nodes=args.max_nodes,
        node_price_per_hour=args.node_price, keep_finished=args.keep_finished,
        keep_finished_days=args.keep_finished_days, recover=args.recover,
        log_budget_bytes=args.log_budget,
        teams_file=None if args.teams is None else str(Path(args.teams).resolve()),
        tls_cert=None if args.tls_cert is None else str(Path(args.tls_cert).resolve()),
        tls_key=None if args.tls_key is None else str(Path(args.tls_key).resolve()))


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)

    def ready(url: str) -> None:
        print(f"pollux server on {url} (policy {config.policy}, backend {config.backend}, "
              f"data {config.data_dir})", flush=True)
        print(f"dashboard {url}/ · API docs {url}/docs · Prometheus {url}/metrics",
              flush=True)
        where = ("$POLLUX_TOKEN" if config.token and not config.token_file
                 else config.token_file or config.data_dir / TOKEN_FILE)
        print(f"open the dashboard with 'pollux dashboard --data-dir {config.data_dir}' or "
              f"once as {url}/?token=<the token in {where}>", flush=True)

    run_server(config, ready)
    print("pollux server stopped", file=sys.stderr, flush=True)
    return 0


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=str(default_data_dir()),
                        help="job store, checkpoints and logs (default: %(default)s)")
    parser.add_argument("--host", default=config_default("host"),
                        help="address to bind; beyond loopback a token is required")
    parser.add_argument("--port", type=int, default=config_default("port"),
                        help="port to bind; 0 picks a free one (default: %(default)s)")
    parser.add_argument("--token", default=None, help=argparse.SUPPRESS)  # refused
    parser.add_argument("--token-file", default=None, metavar="FILE",
                        help="require the bearer token stored in FILE (mode 0600); or set "
                             "$POLLUX_TOKEN; default: one generated into the data dir")
    parser.add_argument("--tls-cert", default=None, metavar="PEM",
                        help="serve HTTPS with this certificate (chain); with --tls-key. "
                             "Use it whenever --host is not loopback")
    parser.add_argument("--tls-key", default=None, metavar="PEM",
                        help="private key of --tls-cert")
    parser.add_argument("--policy", default=config_default("policy"),
                        help="policy spec: NAME or NAME(key=value,...), e.g. "
                             "'pollux(p=-0.5)' (`pollux policies` lists them; default: "
                             "%(default)s)")
    parser.add_argument("--interval", type=float, default=config_default("interval_s"),
                        help="seconds between scheduling rounds (default: %(default)s)")
    parser.add_argument("--backend", default=config_default("backend"), choices=backend_names(),
                        help="where replicas run (default: %(default)s)")
    parser.add_argument("--nodes", type=int, default=config_default("num_nodes"),
                        help="local backend: virtual nodes (default: %(default)s)")
    parser.add_argument("--slots-per-node", type=int, default=config_default("slots_per_node"),
                        help="local backend: GPU or CPU slots per virtual node "
                             "(default: all GPUs, else all CPUs, split over the nodes)")
    parser.add_argument("--virtual-nodes", default=config_default("virtual_nodes"),
                        metavar="SPEC",
                        help="local backend: typed virtual nodes, type:NODESxSLOTS groups, "
                             "e.g. aws:2x2,rtx:1x4 (instead of --nodes/--slots-per-node)")
    parser.add_argument("--gpu-type-speeds", default=config_default("gpu_type_speeds"),
                        metavar="TYPE=SPEED,...",
                        help="relative speed of one GPU of each type, e.g. t4=1,a100=6.9: "
                             "projects a job's model onto types it has not run on (types "
                             "not given are learned from jobs that ran on several)")
    parser.add_argument("--device", default=config_default("device"),
                        choices=("auto", "gpu", "cpu"),
                        help="local backend: slots are GPUs or CPU slots (default: auto)")
    parser.add_argument("--stop-grace", type=float, default=config_default("stop_grace_s"),
                        help="seconds replicas get to checkpoint after SIGTERM "
                             "(default: %(default)s)")
    parser.add_argument("--advertise-address", default=config_default("advertise_host"),
                        metavar="HOST",
                        help="address replicas on other machines use to reach this server "
                             "(hints); default: the bound address (127.0.0.1 for 0.0.0.0)")
    store = parser.add_argument_group("job store")
    store.add_argument("--keep-finished", type=int, default=config_default("keep_finished"),
                       metavar="N",
                       help="finished jobs kept, the newest; older ones are pruned with "
                            "their checkpoints and logs (default: %(default)s)")
    store.add_argument("--keep-finished-days", type=float,
                       default=config_default("keep_finished_days"), metavar="DAYS",
                       help="finished jobs are pruned with their files this many days "
                            "after they finished (default: %(default)s)")
    store.add_argument("--recover", action="store_true",
                       help="the job store was lost or damaged: set it aside, restore its "
                            "newest backup (<data dir>/backups) and move the directories of "
                            "jobs it lacks to <data dir>/lost, then start")
    parser.add_argument("--log-budget", type=log_budget, default=config_default(
                            "log_budget_bytes"), metavar="SIZE",
                        help="local and slurm backends: most bytes each replica's log "
                             "keeps (the newest output; the rest rotated away), e.g. 256MiB "
                             f"(default: {config_default('log_budget_bytes') >> 20}MiB)")
    parser.add_argument("--teams", default=config_default("teams_file"), metavar="FILE",
                        help="teams file (YAML): each team's GPU quota, weight and Slurm "
                             "account; jobs go into one of their owner's teams")
    scaling = parser.add_argument_group("cloud autoscaling")
    scaling.add_argument("--autoscaler", default=config_default("autoscaler"),
                         metavar="{" + ",".join(autoscaler_names()) + "}",
                         help="compute the desired cluster size every round and pass it to "
                              "the backend: pollux (goodput-aware), throughput, or none "
                              "(default)")
    scaling.add_argument("--min-nodes", type=int, default=config_default("min_nodes"),
                         help="autoscaling: fewest nodes (default: %(default)s)")
    scaling.add_argument("--max-nodes", type=int, default=config_default("max_nodes"),
                         help="autoscaling: most nodes (default: the nodes at startup)")
    scaling.add_argument("--node-price", type=float, default=config_default("node_price_per_hour"),
                         help="autoscaling: price of a node-hour, shown with the desired "
                              "size (default: %(default)s)")
    ray = parser.add_argument_group("ray backend")
    ray.add_argument("--ray-address", default=None, metavar="ADDR",
                     help="an existing Ray cluster (auto, HOST:PORT); default: start a "
                          "local Ray instance")
    ray.add_argument("--ray-slot-resource", default=None, metavar="NAME",
                     help="the Ray resource that is a replica's device slot: GPU, CPU or a "
                          "custom resource (default: GPU when the cluster has GPUs, else CPU)")
    ray.add_argument("--ray-gpu-type-prefix", default=None, metavar="PREFIX",
                     help="a node's resource PREFIX<T> names its GPU type <T> (default: "
                          "Ray's accelerator_type:)")
    ray.add_argument("--ray-autoscale", action="store_true",
                     help="pass the policy's desired cluster size to Ray's autoscaler")
    slurm = parser.add_argument_group("slurm backend")
    slurm.add_argument("--slurm-mode", default=None, choices=("cluster", "allocation"),
                       help="cluster: one sbatch job per launch; allocation: job steps of "
                            "the allocation the server runs in (default: allocation when "
                            "SLURM_JOB_ID is set, else cluster)")
    slurm.add_argument("--slurm-partition", default=None, metavar="P",
                       help="cluster mode: the partition to schedule and submit to "
                            "(default: every node Slurm lists, submitted to the default "
                            "partition)")
    slurm.add_argument("--slurm-account", default=None, metavar="A",
                       help="cluster mode: the account jobs are charged to")
    slurm.add_argument("--slurm-nodes", default=None, metavar="HOSTLIST",
                       help="the nodes Pollux may use, a Slurm host list such as "
                            "gpu[01-04] (default: the partition's, or the allocation's)")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("server", help="run the scheduler service",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.set_defaults(func=run)
