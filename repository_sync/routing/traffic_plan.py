"""Traffic plans and the router interface: which percentage of a model's requests each version gets.

A :class:`TrafficPlan` is validated completely before any router touches the gateway: every weight
is an integer percent 0-100 and the weights sum to exactly 100, names end up in NGINX regexes and
file names so they are checked against :data:`MODEL_NAME_RE`, and a :class:`Mirror` names a
``host:port`` recorder. Anything else raises :class:`~ground.exceptions.TrafficPlanError` naming
the plan, the model and each problem; nothing is ever normalised. :class:`TrafficRouter` is the
interface every router implements (:class:`repository_sync.routing.nginx_router.NginxRouter` for NGINX).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import numbers
import re
from typing import Any, Mapping

from ground.exceptions import DataError, TrafficPlanError

#: Model names the router accepts (they end up in NGINX regexes and file names).
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
#: Request header names accepted for sticky routing.
HEADER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
#: Mirror recorder addresses accepted (``host:port``; they end up in an NGINX upstream).
MIRROR_TARGET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}:[0-9]{1,5}$")


# ----------------------------------------------------------------------------------------- plans
@dataclasses.dataclass(frozen=True)
class Route:
    """One version's share of a model's requests.

    Attributes:
        version: Triton model version (positive integer).
        weight: Percent of requests, an integer 0-100 (``None`` when a raw plan omitted it; such a
            route never passes :class:`TrafficPlan` validation).
    """

    version: Any
    weight: Any


@dataclasses.dataclass(frozen=True)
class Mirror:
    """Live shadow: a share of the champion's requests copied to another version.

    The gateway sends a copy of ``percent`` % of the inference requests it routes to the plan's
    champion (drawn independently of the routing) to the mirror recorder at ``target``, which
    forwards them to ``version`` (:mod:`repository_sync.routing.mirror`). NGINX discards the mirror's
    answer: clients never see it.

    Attributes:
        version: The version that answers the mirrored requests (the challenger).
        percent: Integer percent 1-100 of the champion's requests mirrored.
        target: ``host:port`` of the mirror recorder.
    """

    version: Any
    percent: Any
    target: str

    def problems(self, champion: Any) -> list[str]:
        """What is wrong with this mirror (empty: valid)."""
        out = []
        if not _is_int(self.version) or int(self.version) < 1:
            out.append(f"mirror version={self.version!r} is not a positive integer")
        elif _is_int(champion) and int(self.version) == int(champion):
            out.append(f"mirror version {self.version} is the champion itself")
        if not _is_int(self.percent) or not 1 <= int(self.percent) <= 100:
            out.append(f"mirror percent={self.percent!r} is not an integer percent 1-100")
        if not isinstance(self.target, str) or not MIRROR_TARGET_RE.match(self.target):
            out.append(f"mirror target={self.target!r} is not host:port")
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {"version": int(self.version), "percent": int(self.percent), "target": self.target}


@dataclasses.dataclass(frozen=True)
class TrafficPlan:
    """How one model's requests are split between its versions. Validated on construction.

    Attributes:
        model: Triton model name (``[A-Za-z0-9_.-]``, at most 128 characters).
        routes: One :class:`Route` per version; weights are integer percents summing to 100.
        champion: The version that takes 100 % on rollback; defaults to the first route's.
        sticky_header: Request header whose value picks the version (same value, same version);
            requests without it are split by ``$request_id``. ``None``: every request is drawn anew.
        name: Plan name used in messages (defaults to the model name).
        mirror: Live shadow (:class:`Mirror`): a share of the champion's requests also sent to
            another version, whose answers never reach clients. ``None``: no mirror.

    Raises:
        TrafficPlanError: Any problem with the plan; the message names the plan, the model and
            every problem found (sum not 100, missing weight, negative or above-100 weight,
            non-integer percent, bad or duplicate version, unknown champion, bad names).
    """

    model: str
    routes: tuple[Route, ...]
    champion: Any = None
    sticky_header: str | None = None
    name: str = ""
    mirror: Mirror | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "routes", tuple(self.routes))
        if self.champion is None and self.routes:
            object.__setattr__(self, "champion", self.routes[0].version)
        if not self.name:
            object.__setattr__(self, "name", str(self.model))
        problems = _plan_problems(self)
        if problems:
            raise TrafficPlanError(
                f"traffic plan {self.name!r} for model {self.model!r} refused: "
                + "; ".join(problems)
                + ". Expected one weight per version, integer percents 0-100 summing to 100; "
                "nothing was applied"
            )

    # -------------------------------------------------------------- constructors
    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "TrafficPlan":
        """Build and validate a plan from a mapping (YAML/JSON/DAG params).

        Args:
            data: ``{"model": str, "routes": [{"version": int, "weight": int}, ...],
                "champion": int (optional), "sticky_header": str (optional),
                "id" or "name": str (optional)}``.

        Raises:
            TrafficPlanError: The mapping or the plan is invalid (see :class:`TrafficPlan`).
        """
        if not isinstance(data, Mapping):
            raise TrafficPlanError(f"traffic plan {data!r}: expected a mapping with 'model' and 'routes'")
        name = str(data.get("id") or data.get("name") or data.get("model") or "")
        model: Any = data.get("model")  # raw input: TrafficPlan validates it
        raw_routes = data.get("routes")
        if not isinstance(raw_routes, (list, tuple)) or not raw_routes:
            raise TrafficPlanError(
                f"traffic plan {name!r} for model {model!r} refused: routes={raw_routes!r}; "
                "expected a non-empty list of {version, weight}"
            )
        mirror = data.get("mirror")
        if isinstance(mirror, Mapping):
            target: Any = mirror.get("target")  # raw input: Mirror validates it
            mirror = Mirror(version=mirror.get("version"), percent=mirror.get("percent"), target=target)
        routes = []
        for i, r in enumerate(raw_routes):
            if not isinstance(r, Mapping):
                raise TrafficPlanError(
                    f"traffic plan {name!r} for model {model!r} refused: routes[{i}]={r!r}; "
                    "expected a mapping {version, weight}"
                )
            routes.append(Route(version=r.get("version"), weight=r.get("weight")))
        return cls(
            model=model,
            routes=tuple(routes),
            champion=data.get("champion"),
            sticky_header=data.get("sticky_header"),
            name=name,
            mirror=mirror,
        )

    @classmethod
    def from_weights(
        cls,
        model: str,
        weights: Mapping[int, int],
        *,
        champion: int | None = None,
        sticky_header: str | None = None,
        name: str = "",
    ) -> "TrafficPlan":
        """Build a plan from ``{version: percent}``.

        Insertion order is kept; the first version is the champion unless ``champion`` says
        otherwise.
        """
        return cls(
            model=model,
            routes=tuple(Route(v, w) for v, w in weights.items()),
            champion=champion,
            sticky_header=sticky_header,
            name=name,
        )

    @classmethod
    def canary(
        cls,
        model: str,
        champion: int,
        challenger: int,
        percent: int,
        *,
        sticky_header: str | None = None,
    ) -> "TrafficPlan":
        """The plan of a canary step: ``percent`` % to ``challenger``, the rest to ``champion``."""
        if isinstance(percent, numbers.Integral) and not isinstance(percent, bool):
            champion_weight: Any = 100 - int(percent)
        else:
            champion_weight = percent  # refused below with the challenger's problem named
        return cls(
            model=model,
            routes=(Route(champion, champion_weight), Route(challenger, percent)),
            champion=champion,
            sticky_header=sticky_header,
            name=f"{model}@{percent}%",
        )

    @classmethod
    def single(cls, model: str, version: int, *, name: str = "", mirror: Mirror | None = None) -> "TrafficPlan":
        """Build a plan that sends all requests of ``model`` to one version.

        All requests of ``model`` to ``version`` (the rollback plan; with ``mirror``, the live
        shadow plan).
        """
        return cls(model=model, routes=(Route(version, 100),), champion=version, name=name, mirror=mirror)

    # -------------------------------------------------------------- views
    @property
    def weights(self) -> dict[int, int]:
        """``{version: percent}``."""
        return {int(r.version): int(r.weight) for r in self.routes}

    def weight_of(self, version: int) -> int:
        """Percent of requests ``version`` gets (0 when not in the plan)."""
        return self.weights.get(int(version), 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form, readable by :meth:`from_mapping` (``mirror`` only when set)."""
        out = {
            "id": self.name,
            "model": self.model,
            "routes": [{"version": int(r.version), "weight": int(r.weight)} for r in self.routes],
            "champion": int(self.champion),
            "sticky_header": self.sticky_header,
        }
        if self.mirror is not None:
            out["mirror"] = self.mirror.to_dict()
        return out

    @property
    def digest(self) -> str:
        """Short digest of the routing (model, weights, sticky header); sent as ``X-Tritonflow-Plan``."""
        key: dict[str, Any] = {
            "model": self.model,
            "routes": sorted((int(r.version), int(r.weight)) for r in self.routes),
            "sticky_header": (self.sticky_header or "").lower(),
        }
        if self.mirror is not None:
            key["mirror"] = self.mirror.to_dict()
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _plan_problems(plan: TrafficPlan) -> list[str]:
    problems: list[str] = []
    if not isinstance(plan.model, str) or not MODEL_NAME_RE.match(plan.model):
        problems.append(
            f"model={plan.model!r} is not a valid model name (expected [A-Za-z0-9_.-], 1-128 chars)"
        )
    if not plan.routes:
        problems.append("no routes; expected at least one {version, weight}")
        return problems
    route_problems, seen, weights_ok = _route_problems(plan.routes)
    problems.extend(route_problems)
    if weights_ok:
        total = sum(int(r.weight) for r in plan.routes)
        if total != 100:
            shares = ", ".join(f"v{r.version}={r.weight}" for r in plan.routes)
            problems.append(f"weights sum to {total} ({shares}), not 100")
    if plan.champion is not None and _is_int(plan.champion):
        if int(plan.champion) not in seen:
            problems.append(f"champion={plan.champion!r} is not one of the plan's versions {sorted(seen)}")
    else:
        problems.append(f"champion={plan.champion!r} is not a positive integer version")
    problems.extend(_option_problems(plan))
    return problems


def _route_problems(routes: tuple[Route, ...]) -> tuple[list[str], set[int], bool]:
    """Problems with each route, the distinct valid versions seen, and whether every weight is usable."""
    problems: list[str] = []
    seen: set[int] = set()
    weights_ok = True
    for i, r in enumerate(routes):
        label = f"routes[{i}] (version {r.version!r})"
        if not isinstance(r, Route):
            problems.append(f"routes[{i}]={r!r} is not a Route")
            weights_ok = False
            continue
        if not _is_int(r.version) or int(r.version) < 1:
            problems.append(f"{label}: version={r.version!r} is not a positive integer")
        elif int(r.version) in seen:
            problems.append(f"{label}: version {r.version} appears twice")
        else:
            seen.add(int(r.version))
        weight_problem = _weight_problem(label, r.weight)
        if weight_problem:
            problems.append(weight_problem)
            weights_ok = False
    return problems, seen, weights_ok


def _weight_problem(label: str, w: Any) -> str | None:
    """Why a route's weight is not an integer percent in 0..100, ``None`` when it is one."""
    if w is None:
        return f"{label}: weight is missing"
    if not _is_int(w):
        return (
            f"{label}: weight={w!r} is not an integer percent "
            f"({type(w).__name__}; fractions and strings are refused, never rounded)"
        )
    if w < 0:
        return f"{label}: weight={w} is negative"
    if w > 100:
        return f"{label}: weight={w} is above 100"
    return None


def _option_problems(plan: TrafficPlan) -> list[str]:
    """Problems with the plan's optional parts: sticky header, name and mirror."""
    problems: list[str] = []
    if plan.sticky_header is not None and (
        not isinstance(plan.sticky_header, str) or not HEADER_NAME_RE.match(plan.sticky_header)
    ):
        problems.append(
            f"sticky_header={plan.sticky_header!r} is not a header name (expected [A-Za-z0-9-])"
        )
    if not isinstance(plan.name, str):
        problems.append(f"name={plan.name!r} is not a string")
    if plan.mirror is not None:
        if not isinstance(plan.mirror, Mirror):
            problems.append(f"mirror={plan.mirror!r} is not a Mirror")
        else:
            problems.extend(plan.mirror.problems(plan.champion))
    return problems


def coerce_plan(plan: TrafficPlan | Mapping[str, Any]) -> TrafficPlan:
    """Return ``plan`` as a validated :class:`TrafficPlan` (mappings go through ``from_mapping``)."""
    if isinstance(plan, TrafficPlan):
        return plan
    return TrafficPlan.from_mapping(plan)


# ----------------------------------------------------------------------------------- interface
class TrafficRouter(abc.ABC):
    """Splits each model's requests between its versions.

    Implementations must validate a plan completely before changing anything and must leave the
    live routing unchanged when applying fails.
    """

    @abc.abstractmethod
    def apply(self, plan: TrafficPlan | Mapping[str, Any]) -> TrafficPlan:
        """Validate ``plan`` and make it the live routing of its model; return the applied plan.

        Raises:
            TrafficPlanError: The plan is invalid; nothing changed.
            GatewayConfigError: The gateway refused the generated config; the previous is live.
            GatewayReloadError: The gateway could not be reloaded; the previous config is restored.
        """

    @abc.abstractmethod
    def current_plan(self, model: str) -> TrafficPlan | None:
        """The plan live for ``model`` (``None``: the router does not route it)."""

    @abc.abstractmethod
    def previous_plan(self, model: str) -> TrafficPlan | None:
        """The plan that was live before the last successful :meth:`apply` (``None`` if none)."""

    def rollback(self, model: str, champion: int | None = None) -> TrafficPlan:
        """Send 100 % of ``model``'s requests to ``champion`` (default: the live plan's champion).

        Raises:
            DataError: No champion is given and the router has no live plan for ``model``.
            GatewayConfigError, GatewayReloadError: As :meth:`apply`.
        """
        if champion is None:
            live = self.current_plan(model)
            if live is None:
                raise DataError(
                    f"rollback of model {model!r}: champion=None and no live plan names one; "
                    "pass the champion version"
                )
            champion = int(live.champion)
        return self.apply(TrafficPlan.single(model, champion, name=f"{model}:rollback"))
