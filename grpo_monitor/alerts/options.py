"""``AlertOptions``: where alerts go and how, checked when built, so a mistyped option is one clear
line before training starts, never a warning in the middle of it.

Every error names the parameter as the user wrote it: ``AlertOptions(min_severity=...)`` for a field,
``attach(alerts=...)`` for the shorthand ``attach`` turns into options, or the environment variable.

>>> AlertOptions(to=False).enabled
False
>>> AlertOptions(to="https://hooks.slack.com/services/T/B/x", min_severity="info")
Traceback (most recent call last):
...
grpo_monitor.alerts.options.OptionError: AlertOptions(min_severity=...): must be one of ('warning', 'critical'), got 'info'
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from grpo_monitor.alerts.events import RANK
from grpo_monitor.alerts.formats import FORMATS, check_template
from grpo_monitor.alerts.mail import EmailDestination
from grpo_monitor.alerts.webhook import ENV_FORMAT, ENV_ROUTING_KEY, ENV_URL, WebhookDestination, check_headers

MIN_SEVERITIES = ("warning", "critical")
# What a destination given as a dict may say; the options are its defaults.
WEBHOOK_KEYS = ("url", "format", "headers", "template", "mention", "routing_key", "idempotent", "min_severity",
                "timeout", "retries", "per_minute", "burst")
EMAIL_KEYS = ("email", "smtp", "from", "password", "min_severity", "timeout", "retries", "per_minute", "burst")

T = TypeVar("T")


class OptionError(ValueError):
    """A wrong option value, as one line: ``where`` is what the user wrote (``attach(alerts=...)``,
    ``AlertOptions(burst=...)``), ``reason`` what is wrong with it."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


def field_error(owner: Any, name: str, reason: str) -> OptionError:
    return OptionError(f"{type(owner).__name__}({name}=...)", reason)


def from_shorthand(cls: type[T], field: str, value: Any, param: str) -> T:
    """``cls(field=value)``, for the shorthand ``attach(param=value)``: an error in that field names
    ``attach(param=...)``, which is what the user wrote."""
    try:
        return cls(**{field: value})
    except OptionError as exc:
        if exc.where != f"{cls.__name__}({field}=...)":
            raise
        raise OptionError(f"attach({param}=...)", exc.reason) from None


def number_reason(value: Any, *, minimum: float, integer: bool = False, strict: bool = False) -> str | None:
    """Why ``value`` is not a number above ``minimum`` (None when it is)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (value > minimum if strict else value >= minimum)
    if ok and integer:
        ok = float(value).is_integer()
    if ok:
        return None
    return f"must be a {'whole ' if integer else ''}number {'>' if strict else '>='} {minimum:g}, got {value!r}"


class Route:
    """One destination as the dispatcher uses it: what it is, its rate limit and minimum severity."""

    def __init__(self, destination: Any, *, min_severity: str, per_minute: float, burst: int) -> None:
        self.destination = destination
        self.min_rank = RANK[min_severity]
        self.per_minute, self.burst = per_minute, burst

    @property
    def name(self) -> str:
        return self.destination.name


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class AlertOptions:
    """Where findings and the run's life (a restart, a crash, its end) are sent, and how.

    ``attach(trainer, alerts=...)`` takes one of these, or its ``to`` alone (a URL, ``mailto:``, a dict
    or a list of those, ``False``). Every field but ``to`` and ``trackers`` is the default of each
    destination, which a destination given as a dict may set for itself (``min_severity``,
    ``timeout``, ``retries``, ``per_minute``, ``burst``, and a webhook's ``format``, ``headers``,
    ``template``, ``mention``). See ``docs/ALERTS.md``.
    """

    to: str | Mapping[str, Any] | Sequence[str | Mapping[str, Any]] | bool | None = None
    """Destinations: a webhook URL (Slack, Discord, Teams, PagerDuty or any JSON endpoint),
    ``mailto:ADDRESS[,ADDRESS]`` (the SMTP server from ``$GRPO_MONITOR_SMTP_URL``), a dict describing one
    (``{"url": ..., "headers": ..., "routing_key": ...}`` or ``{"email": ..., "smtp": ..., "from": ...}``),
    or a list of those. None or True: ``$GRPO_MONITOR_WEBHOOK_URL`` when set. False: no alerts at all,
    the trackers' neither."""
    format: str | None = None
    """``slack``, ``discord``, ``teams``, ``pagerduty`` or ``generic``; None: ``$GRPO_MONITOR_WEBHOOK_FORMAT``,
    else recognised from each URL."""
    min_severity: str = "warning"
    """``warning`` or ``critical``: the least severe finding a destination is sent."""
    trackers: bool | str | Sequence[str] = True
    """The trainer's trackers (W&B, trackio, TensorBoard, MLflow) get the findings in their own run: True
    follows ``args.report_to``, False none, or the names of those to keep."""
    per_minute: float = 20.0
    """Rate limit per destination: messages a minute once ``burst`` is spent."""
    burst: int = 5
    """Rate limit per destination: messages at once."""
    retries: int = 3
    """Tries after the first while a message is not taken."""
    timeout: float = 5.0
    """Seconds each request may take."""
    flush_timeout: float = 5.0
    """Seconds the end of training waits, at most, for every destination's queue to drain."""
    headers: Mapping[str, str] | None = None
    """HTTP headers for every webhook (``{"Authorization": "Bearer ..."}``)."""
    template: Any = None
    """A payload template (a dict, list or string with ``{fields}``) or a function of the message, for every webhook."""
    mention: str | None = None
    """Put before critical messages (``<!here>``, ``<!subteam^S0123>``)."""
    max_per_run: int | None = None
    """At most this many finding messages for the whole run (None: no cap)."""
    cooldown_steps: int = 0
    """Steps a detector stays quiet after a message (a critical one always goes out)."""
    routes: list[Route] = dataclasses.field(init=False, default_factory=list)
    """The destinations, built and checked."""

    def __post_init__(self) -> None:
        if self.min_severity not in MIN_SEVERITIES:
            raise field_error(self, "min_severity", f"must be one of {MIN_SEVERITIES}, got {self.min_severity!r}")
        fmt = self.format
        if fmt is not None and fmt not in FORMATS:
            raise field_error(self, "format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
        if fmt is None and os.environ.get(ENV_FORMAT):
            fmt = os.environ[ENV_FORMAT]
            if fmt not in FORMATS:
                raise OptionError(f"${ENV_FORMAT}", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
        object.__setattr__(self, "format", fmt)
        trackers = self.trackers
        if not (trackers is True or trackers is False or isinstance(trackers, str)
                or (isinstance(trackers, (list, tuple)) and all(isinstance(t, str) for t in trackers))):
            raise field_error(self, "trackers", f"must be True, False or tracker names, got {trackers!r}")
        for name, minimum, integer, strict in (("per_minute", 0, False, True), ("burst", 1, True, False),
                                               ("retries", 0, True, False), ("timeout", 0, False, True),
                                               ("flush_timeout", 0, False, False), ("cooldown_steps", 0, True, False)):
            self._number(name, minimum=minimum, integer=integer, strict=strict)
        if self.max_per_run is not None:
            self._number("max_per_run", minimum=1, integer=True)
        for name, check in (("headers", check_headers), ("template", check_template)):
            try:
                check(getattr(self, name))
            except ValueError as exc:  # the lower layers name the key a destination dict would have
                raise field_error(self, name, str(exc).removeprefix(name).lstrip(": ")) from None
        if self.mention is not None and (not isinstance(self.mention, str) or not self.mention.strip()):
            raise field_error(self, "mention", f"must be a non-empty string such as '<!here>', got {self.mention!r}")
        object.__setattr__(self, "routes", self._routes())

    def _number(self, name: str, **bounds: Any) -> None:
        value = getattr(self, name)
        reason = number_reason(value, **bounds)
        if reason:
            raise field_error(self, name, reason)
        object.__setattr__(self, name, int(value) if bounds.get("integer") else float(value))

    @property
    def enabled(self) -> bool:
        return self.to is not False

    def _routes(self) -> list[Route]:
        to = self.to
        if to is False:
            return []
        if to is None or to is True:
            if not os.environ.get(ENV_URL):
                return []
            try:
                return [self._route(os.environ[ENV_URL], 0)]
            except ValueError as exc:
                raise OptionError(f"${ENV_URL}", str(exc)) from None
        if isinstance(to, (str, Mapping)):
            specs: list[Any] = [to]
        elif isinstance(to, (list, tuple)):
            specs = list(to)
        else:
            raise field_error(self, "to", "must be a webhook URL, mailto:ADDRESS, a dict describing a destination, "
                                          f"a list of those, True or False; got {type(to).__name__}")
        routes = []
        for i, spec in enumerate(specs):
            try:
                routes.append(self._route(spec, i))
            except ValueError as exc:
                raise field_error(self, "to", f"destination {i + 1}: {exc}" if len(specs) > 1 else str(exc)) from None
        return routes

    def _route(self, spec: Any, i: int) -> Route:
        if isinstance(spec, str):
            spec = {"email": spec[len("mailto:"):]} if spec.startswith("mailto:") else {"url": spec}
        if not isinstance(spec, Mapping):
            raise ValueError(f"a destination is a URL, mailto:ADDRESS or a dict, got {type(spec).__name__}")
        spec = dict(spec)
        kind = "email" if "email" in spec else "webhook"
        allowed = EMAIL_KEYS if kind == "email" else WEBHOOK_KEYS
        unknown = sorted(set(spec) - set(allowed))
        if unknown or (kind == "webhook" and "url" not in spec):
            need = "" if "url" in spec or kind == "email" else "a 'url' or an 'email'; "
            raise ValueError(f"{need}unknown keys {unknown}; a {kind} destination takes {', '.join(allowed)}")
        min_severity = spec.get("min_severity", self.min_severity)
        if min_severity not in MIN_SEVERITIES:
            raise ValueError(f"min_severity must be one of {MIN_SEVERITIES}, got {min_severity!r}")
        bounds = {"timeout": dict(minimum=0, strict=True), "retries": dict(minimum=0, integer=True),
                  "per_minute": dict(minimum=0, strict=True), "burst": dict(minimum=1, integer=True)}
        given = {}
        for key, bound in bounds.items():
            value = spec.get(key, getattr(self, key))
            reason = number_reason(value, **bound)
            if reason:
                raise ValueError(f"{key} {reason}")
            given[key] = int(value) if bound.get("integer") else float(value)
        if kind == "email":
            dest: Any = EmailDestination(spec["email"], spec.get("smtp"), spec.get("from"), password=spec.get("password"),
                                         timeout=given["timeout"], retries=given["retries"])
        else:
            dest = WebhookDestination(spec["url"], spec.get("format", self.format), headers=spec.get("headers", self.headers),
                                      template=spec.get("template", self.template), mention=spec.get("mention", self.mention),
                                      routing_key=spec.get("routing_key") or os.environ.get(ENV_ROUTING_KEY),
                                      idempotent=spec.get("idempotent"), timeout=given["timeout"], retries=given["retries"])
        return Route(dest, min_severity=min_severity, per_minute=given["per_minute"], burst=given["burst"])

    @property
    def url(self) -> str | None:
        """The first webhook's URL (kept for callers that had one destination)."""
        for r in self.routes:
            if isinstance(r.destination, WebhookDestination):
                return r.destination._url
        return None

    def scrub(self, text: str) -> str:
        for r in self.routes:
            text = r.destination.scrub(text)
        return text

    def __repr__(self) -> str:  # never a URL or a header
        return f"AlertOptions(destinations={[r.name for r in self.routes]}, min_severity={self.min_severity})"

    @classmethod
    def of(cls, value: Any, param: str = "alerts") -> AlertOptions:
        """``value`` as options: an ``AlertOptions`` as it is, anything else as its ``to`` (what
        ``attach(alerts=...)`` takes); an error in that names ``attach(<param>=...)``."""
        if isinstance(value, AlertOptions):
            return value
        return from_shorthand(cls, "to", value, param)


__all__ = ["EMAIL_KEYS", "MIN_SEVERITIES", "WEBHOOK_KEYS", "AlertOptions", "OptionError", "Route", "from_shorthand"]
