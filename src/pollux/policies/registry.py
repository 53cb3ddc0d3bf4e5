"""Policies by spec: the one way to build a policy (the simulator, the service, the CLI).

A spec is a registered name with options, ``pollux(p=-0.5,exploration_factor=4)``
(:mod:`pollux.spec`), or any :class:`~pollux.policies.base.Policy` class given as
``module:Class`` (with options too). Every policy is built with an explicit ``seed``;
options a policy does not take are refused with the valid ones. Old names keep working
with a warning that names the new spelling.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pollux.errors import ConfigError
from pollux.plugins import load_plugin_class
from pollux.policies.base import OptionDoc, Policy
from pollux.spec import format_spec, parse_spec


@dataclass(frozen=True)
class NamedPolicy:
    """A registered policy: its ``module:Class``, one line for ``pollux policies``, and the
    options its name sets (a spec's own options may override them)."""

    target: str
    summary: str
    fixed: Mapping[str, Any] = field(default_factory=dict)


_POLLUX = "pollux.policies.pollux:PolluxPolicy"
NAMED_POLICIES: Mapping[str, NamedPolicy] = MappingProxyType({
    "pollux": NamedPolicy(_POLLUX, "the project's best Pollux on each cluster kind "
                                   "(docs/research/policies.md: "
                                   "'pollux is our best'); options as pollux-paper's"),
    "pollux-paper": NamedPolicy(_POLLUX, "the paper's objective (Sia's program on several GPU "
                                         "types) on the fast optimizer", {"base": "paper"}),
    "pollux-ga": NamedPolicy(_POLLUX, "the paper's objective on its genetic algorithm "
                                      "(faithful, slow)", {"base": "paper", "optimizer": "ga"}),
    "sia": NamedPolicy("pollux.policies.sia:SiaPolicy", "Sia (SOSP'23) as published"),
    "pollux-unaware": NamedPolicy("pollux.policies.pollux_unaware:PolluxUnawarePolicy",
                                  "Pollux blind to GPU types (Sia's baseline)"),
    "tiresias": NamedPolicy("pollux.policies.tiresias:TiresiasPolicy",
                            "Tiresias: two-queue least-attained-service, user's GPU count"),
    "quota-tiresias": NamedPolicy("pollux.policies.quota_tiresias:QuotaTiresiasPolicy",
                                  "Kueue-like quotas: Tiresias inside each team's quota, "
                                  "borrowing idle quota, reclaim by preemption"),
    "optimus": NamedPolicy("pollux.policies.optimus:OptimusPolicy",
                           "Optimus: marginal-gain GPUs from the remaining-time oracle"),
    "fifo": NamedPolicy("pollux.policies.fifo:FifoPolicy",
                        "first come first served at the user's GPU count"),
})
"""Registered policy names (read-only)."""

DEPRECATED_NAMES: Mapping[str, str] = MappingProxyType({
    "pollux-remaining": "pollux(remaining_weight=0.5,remaining_restart=true,"
                        "min_restart_gain=0.2,shrink_whole_nodes=true)",
    "pollux-hetero": "pollux-paper",
})
"""Old names -> the spec that now means the same (a warning names it)."""

POLICY_CLASSES: Mapping[str, str] = MappingProxyType(
    {name: named.target for name, named in NAMED_POLICIES.items()})
"""Registered policy names -> ``module:Class`` (read-only)."""


def policy_names() -> list[str]:
    return sorted(NAMED_POLICIES)


def _resolve(spec: str) -> tuple[str, type, dict[str, Any], dict[str, Any]]:
    """(name, class, options the name fixes, options the spec gives) of ``spec``."""
    name, given = parse_spec(spec)
    if name in DEPRECATED_NAMES:
        new = DEPRECATED_NAMES[name]
        warnings.warn(f"policy {name!r} is deprecated: write {new!r}", FutureWarning,
                      stacklevel=3)
        new_name, new_options = parse_spec(new)
        name, given = new_name, {**new_options, **given}
    if ":" in name and name not in NAMED_POLICIES:
        cls = load_plugin_class("policy", name, {name: name})
        if not (isinstance(cls, type) and issubclass(cls, Policy)):
            raise ConfigError("policy", name, "name a subclass of pollux.policies.Policy")
        return name, cls, {}, given
    return name, load_policy_class(name), dict(NAMED_POLICIES[name].fixed), given


def load_policy_class(name: str) -> type:
    """The class of registered policy ``name`` (UnknownPluginError with the choices)."""
    return load_plugin_class("policy", name, POLICY_CLASSES)


def class_options(cls: type, fixed: Mapping[str, Any] | None = None) -> list[OptionDoc]:
    """The options ``cls`` takes (with ``fixed`` set): its own table (a classmethod
    ``option_docs(**fixed)``) or the keyword parameters of its ``__init__`` chain."""
    docs = getattr(cls, "option_docs", None)
    if callable(docs):
        table: list[OptionDoc] = docs(**(fixed or {}))
        if table:
            return table
    found: dict[str, OptionDoc] = {}
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or klass is Policy:
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters.values()
        for param in params:
            if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY) \
                    and param.name not in ("self", "seed") and param.name not in found:
                default = None if param.default is param.empty else param.default
                found[param.name] = OptionDoc(param.name, {"": default}, "")
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return list(found.values())


def _check_options(name: str, cls: type, options: Mapping[str, Any]) -> None:
    valid = [doc.name for doc in class_options(cls)]
    for key in options:
        if key not in valid:
            raise ConfigError(f"{name} option", key,
                              f"{name} takes: {', '.join(valid) or 'no options'} "
                              f"(`pollux policies` lists them with their defaults)")


def canonical_spec(spec: str) -> str:
    """``spec`` checked (name and options) and written canonically; old names become
    their new spelling (with a warning)."""
    name, cls, _, given = _resolve(spec)
    _check_options(name, cls, given)
    return format_spec(name, given)


def make_policy(spec: str, *, seed: int = 0, **options: Any) -> Policy:
    """Instantiate policy ``spec`` (registered name or ``module:Class``, with options) with
    ``seed`` and keyword ``options`` on top; unknown names list the valid choices and
    unknown options the valid ones. The policy's ``name`` is the canonical spec."""
    name, cls, fixed, given = _resolve(spec)
    given = {**given, **options}
    _check_options(name, cls, given)
    try:
        policy: Policy = cls(seed=seed, **{**fixed, **given})
    except (TypeError, ValueError) as exc:  # a value of the wrong type for a plain __init__
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{name} options", format_spec(name, given),
                          f"check the values' types ({exc})") from exc
    policy.name = format_spec(name, given)
    return policy
