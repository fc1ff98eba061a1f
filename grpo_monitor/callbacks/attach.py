"""``attach(trainer)``: the two-line integration, and the one wrapper around ``trainer.train``."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from grpo_monitor.alerts.dispatch import describe
from grpo_monitor.alerts.options import AlertOptions, OptionError, from_shorthand
from grpo_monitor.callbacks.finding_costs import FindingCosts
from grpo_monitor.callbacks.monitor_callback import MonitorCallback
from grpo_monitor.callbacks.options import (
    DeviceOptions,
    RestartOptions,
    RewardGateOptions,
    RouterOptions,
    SampleOptions,
    SegmentPlace,
)
from grpo_monitor.callbacks.reward_tap import SampleRetention
from grpo_monitor.core.runlog import RUN_FILE
from grpo_monitor.detectors.base import Detector

logger = logging.getLogger("grpo_monitor")


def default_run_dir(trainer: Any) -> Path:
    return Path(trainer.args.output_dir) / "grpo-monitor"


def _check_overrides_applied(args: Any, overrides: dict[str, Any]) -> None:
    from grpo_monitor.core.recommend import _same

    missing = {k: v for k, v in overrides.items() if k != "output_dir" and not _same(getattr(args, k, None), v)}
    if missing:
        logger.warning(
            "grpo-monitor: this relaunch did not apply the restart overrides %s: parse TRL flags "
            "(HfArgumentParser/TrlParser) or call `args = grpo_monitor.core.restart.patched_args(args)` before building the trainer",
            missing,
        )


def _check_reward_roles(trainer: Any, options: dict[str, Any]) -> None:
    """A named correctness or format reward must be one of the trainer's reward functions: a typo
    would otherwise leave every sample's ``correct`` empty for the whole run."""
    names = list(getattr(trainer, "reward_func_names", None) or [])
    for option, value in options.items():
        if value is not None and not isinstance(value, str):
            raise OptionError(f"attach({option}=...)", f"must be a reward function's name, got {value!r}")
        if value is not None and names and value not in names:
            raise OptionError(f"attach({option}=...)", f"{value!r} is not one of this trainer's reward functions "
                                                       f"({', '.join(names)}); pass one of those names")


def _is_main_process(trainer: Any) -> bool:
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_main_process"):
        return bool(accelerator.is_main_process)
    return int(getattr(trainer.args, "process_index", 0) or 0) == 0


def _say(message: str) -> None:
    """An INFO line that shows by default: through logging where it is set up to show INFO, else
    on stderr (Python's default logging drops INFO), and not at all where a user raised the
    monitor's logger above INFO on purpose."""
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info(message)
    elif logger.level == logging.NOTSET or logger.isEnabledFor(logging.INFO):
        print(message, file=sys.stderr, flush=True)


def _role(callback: MonitorCallback, option: str, given: dict[str, Any]) -> str:
    name = getattr(callback, option)
    if name is None:
        return "none recognised"
    return f"{name} ({'given' if given.get(option) else 'guessed from its name'})"


def relaunch_command(argv: Sequence[str]) -> str:
    """The ``supervise`` command that runs this script again, relaunching it at each restart request.

    >>> relaunch_command(["train.py", "--lr", "1e-6"])
    'grpo-monitor supervise -- python train.py --lr 1e-6'
    """
    argv = list(argv) if argv and argv[0] not in ("", "-c", "-") else ["train.py"]
    return shlex.join(["grpo-monitor", "supervise", "--", "python", *argv])


def _alerts_line(options: AlertOptions) -> str:
    """Where findings are sent, destinations masked, so a user sees at start that alerts are set up."""
    if not options.enabled:
        return "grpo-monitor: alerts off (alerts=False)"
    where = describe(options)
    trackers = "the trainer's trackers" if options.trackers else None
    if not where:
        return ("grpo-monitor: alerts go to " + (trackers or "nowhere") + "; no webhook or mail destination "
                "(attach(trainer, alerts=URL) or GRPO_MONITOR_WEBHOOK_URL)")
    return (f"grpo-monitor: alerts ({options.min_severity} and above) go to " + "; ".join(where)
            + (f" and {trackers}" if trackers else ""))


def _announce(callback: MonitorCallback, given: dict[str, Any], alerts: AlertOptions) -> None:
    """Where the run log goes, which reward functions the monitor takes as correctness and as
    format, and where alerts go; a warning naming the option when no correctness reward was recognised."""
    names = callback.reward_names
    _say(f"grpo-monitor: run log in {callback.run_dir / RUN_FILE}; correctness reward: "
         f"{_role(callback, 'correctness_reward', given)}, format reward: {_role(callback, 'format_reward', given)}"
         + (f" (reward functions: {', '.join(names)})" if names else ""))
    _say(_alerts_line(alerts))
    if names and callback.correctness_reward is None:
        candidates = [n for n in names if n != callback.format_reward] or names
        logger.warning(
            "grpo-monitor: none of the reward functions (%s) was recognised as the correctness reward, so no "
            "sample is marked right or wrong: the run header records none, the dashboard's ok column and correct "
            "filter stay empty, and detectors that read correctness go without it. Name it: "
            "attach(trainer, correctness_reward=%r)", ", ".join(names), candidates[0])


# attach's keywords of old, each now a field of an options object: the error says where it went.
_MOVED = {
    "max_text_chars": "sample_text=SampleOptions(max_text_chars=...)",
    "correct_threshold": "sample_text=SampleOptions(correct_threshold=...)",
    "moe_probe_every": "router_tap=RouterOptions(probe_every=...)",
    "device_interval_s": "device_health=DeviceOptions(interval_s=...)",
    "nvml_device": "device_health=DeviceOptions(device=...)",
    "max_restarts": "auto_restart=RestartOptions(max_restarts=...)",
    "restart_from": "auto_restart=RestartOptions(restart_from=...)",
    "gate_min_agreement": "require_reward_gate=RewardGateOptions(min_agreement=...)",
}


def _unknown_keywords(unknown: Sequence[str]) -> str:
    """The one-line error for keywords ``attach`` does not take: where a keyword of old went, else
    the nearest it does take.

    >>> _unknown_keywords(["correctnes_reward"])
    "grpo_monitor.attach() got an unexpected keyword argument 'correctnes_reward' (did you mean correctness_reward?); see help(grpo_monitor.attach)"
    >>> _unknown_keywords(["alerts_min_severity"])
    "grpo_monitor.attach() got an unexpected keyword argument 'alerts_min_severity' (write alerts=AlertOptions(to=..., min_severity=...)); see help(grpo_monitor.attach)"
    """
    import difflib

    known = [n for n in inspect.signature(attach).parameters if n != "trainer"]
    alert_fields = {f.name for f in dataclasses.fields(AlertOptions) if f.init}
    moved, hints = [], []
    for k in unknown:
        field = k.removeprefix("alerts_")
        if k in _MOVED:
            moved.append(_MOVED[k])
        elif k.startswith("alerts_") and field in alert_fields:
            moved.append(f"alerts=AlertOptions(to=..., {field}=...)")
        else:
            hints += difflib.get_close_matches(k, known, n=1)
    hint = (f" (write {'; '.join(moved)})" if moved else "") + (f" (did you mean {', '.join(hints)}?)" if hints else "")
    many = len(unknown) > 1
    return (f"grpo_monitor.attach() got {'' if many else 'an '}unexpected keyword argument{'s' if many else ''} "
            f"{', '.join(map(repr, unknown))}{hint}; see help(grpo_monitor.attach)")


F = TypeVar("F", bound=Callable[..., Any])


def _names_unknown_keywords(fn: F) -> F:
    """Python's own error for an unknown keyword names neither the package nor where an old keyword went."""
    params = inspect.signature(fn).parameters

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        unknown = [k for k in kwargs if k not in params]
        if unknown:
            raise TypeError(_unknown_keywords(unknown))
        return fn(*args, **kwargs)

    return cast(F, checked)


def _feature(param: str, value: Any, options: type[Any]) -> Any:
    """A feature parameter's value as its options (None when off): True is the defaults, False off."""
    if value is True:
        return options()
    if value is False:
        return None
    if isinstance(value, options):
        return value
    raise OptionError(f"attach({param}=...)", f"must be True, False or a {options.__name__}, got {value!r}")


def _watch_train(trainer: Any, callback: MonitorCallback) -> None:
    """Wrap ``trainer.train``, once: a training loop that leaves by an exception (a crash, Ctrl-C,
    ``sys.exit``) calls no callback, so the monitor hears of it here (``MonitorCallback.interrupted``:
    the alerts' crash message, the run log's note, the parts let go of). Whatever goes wrong in the
    monitor meanwhile is logged once; the training's own exception is raised unchanged."""
    train = trainer.train
    if getattr(train, "__grpo_monitor__", None) is callback:
        return

    @functools.wraps(train)
    def train_watched(*args: Any, **kwargs: Any) -> Any:
        try:
            return train(*args, **kwargs)
        except BaseException as exc:
            try:
                callback.interrupted(exc)
            except Exception as err:  # the caller must see the training's exception, not the monitor's
                with contextlib.suppress(Exception):
                    callback.report_error("interruption", err)
            raise

    train_watched.__grpo_monitor__ = callback  # type: ignore[attr-defined]
    trainer.train = train_watched


@_names_unknown_keywords
def attach(
    trainer: Any,
    run_dir: str | os.PathLike[str] | None = None,
    *,
    alerts: AlertOptions | str | Mapping[str, Any] | Sequence[str | Mapping[str, Any]] | bool | None = None,
    correctness_reward: str | None = None,
    format_reward: str | None = None,
    sample_text: SampleOptions | str | Mapping[str, int] | SampleRetention = "default",
    auto_restart: RestartOptions | bool = False,
    device_health: DeviceOptions | bool = True,
    router_tap: RouterOptions | bool = True,
    require_reward_gate: RewardGateOptions | bool = False,
    detectors: Sequence[Detector] | None = None,
    rules: str | os.PathLike[str] | Sequence[Any] | None = None,
    gpu_hour_price: float | None = None,
    dashboard: bool = False,
    place: SegmentPlace | None = None,
) -> MonitorCallback:
    """Attach the monitor to a ``GRPOTrainer`` (or any TRL/transformers trainer) and return its callback.

    ``run_dir`` defaults to ``<output_dir>/grpo-monitor``; under ``grpo-monitor supervise`` the
    supervisor's segment directory wins. Everything is checked before the trainer is touched: a wrong
    value is one ``ValueError`` line naming the parameter as written (``attach(alerts=...): ...``,
    ``RestartOptions(max_restarts=...): ...``).

    - ``alerts``: an ``AlertOptions``, or its ``to`` alone: a webhook URL (Slack, Discord, Teams, PagerDuty,
      any JSON endpoint), ``mailto:ADDRESS``, a dict describing a destination, or a list of those; None:
      ``$GRPO_MONITOR_WEBHOOK_URL``; False turns every alert off, the trackers' too. See ``docs/ALERTS.md``.
    - ``correctness_reward`` / ``format_reward``: reward function names, checked against the trainer's;
      guessed from the names otherwise (a warning names the option when no correctness reward is recognised).
    - ``sample_text``: a ``SampleOptions`` (which completions keep text, how much, the correctness
      threshold), or its ``sample_text`` alone: ``"default"``, ``"all"``, ``"none"``, or a dict /
      ``SampleRetention`` with ``fair``, ``groups``, ``truncated``.
    - ``auto_restart``: True or a ``RestartOptions`` (``max_restarts``, ``restart_from``) stops on a confirmed
      finding and writes a restart plan (off by default).
    - ``device_health``: the GPU's health through NVML (on by default; inert without NVML or a GPU); False
      turns it off, a ``DeviceOptions`` sets ``interval_s`` and ``device``.
    - ``router_tap``: a MoE model's routing statistics (on by default); False leaves the routers unhooked,
      a ``RouterOptions`` sets ``probe_every``.
    - ``require_reward_gate``: True or a ``RewardGateOptions`` (``min_agreement``) refuses to train
      (``RewardGateError``, naming the command to run) until ``grpo-monitor inspect-rewards`` has saved a
      passed verdict for these reward functions in the run directory.
    - ``detectors``: a list replacing the built-in set. ``rules``: a team's rule file (JSON, YAML or TOML;
      see the README) or its rules as dicts, recorded in the run header. ``gpu_hour_price``: the price of
      one GPU-hour, so each finding's ``evidence["cost"]`` has money too.
    - ``dashboard=True`` prints the ``grpo-monitor watch`` command for this run. ``place``: where the run
      stands in a restarted lineage (``run_with_restarts`` and the supervisor set it).

    ``trainer.train`` is wrapped once, so a crash or Ctrl-C is said in the alerts and the run log and then
    raised unchanged. The main process says once where the run log goes and which reward functions count
    as correctness and as format.

    >>> monitor_cb = attach(trainer, alerts="https://hooks.slack.com/services/T/B/x")   # doctest: +SKIP
    >>> trainer.train()                                                                   # doctest: +SKIP
    """
    from grpo_monitor.core.restart import env_state

    for cb in getattr(trainer.callback_handler, "callbacks", []):
        if isinstance(cb, MonitorCallback):
            return cb  # attaching twice would double-wrap the reward functions and the training
    if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
        raise OptionError("attach(run_dir=...)", f"must be a folder path, got {type(run_dir).__name__}")
    if not isinstance(dashboard, bool):
        raise OptionError("attach(dashboard=...)", f"must be True or False, got {dashboard!r}")
    if place is not None and not isinstance(place, SegmentPlace):
        raise OptionError("attach(place=...)", f"must be a SegmentPlace, got {type(place).__name__}")
    if detectors is not None and (isinstance(detectors, (str, bytes)) or not isinstance(detectors, Sequence)
                                  or not all(isinstance(d, Detector) for d in detectors)):
        raise OptionError("attach(detectors=...)", f"must be a list of Detector instances, got {detectors!r}")
    # Checked here (the environment's webhook too), so a mistyped option fails now, not mid-run.
    alert_opts = AlertOptions.of(alerts, "alerts")
    samples = sample_text if isinstance(sample_text, SampleOptions) else \
        from_shorthand(SampleOptions, "sample_text", sample_text, "sample_text")
    restarts = _feature("auto_restart", auto_restart, RestartOptions)
    device = _feature("device_health", device_health, DeviceOptions)
    router = _feature("router_tap", router_tap, RouterOptions)
    gate = _feature("require_reward_gate", require_reward_gate, RewardGateOptions)
    given = {"correctness_reward": correctness_reward, "format_reward": format_reward}
    _check_reward_roles(trainer, given)
    loaded: list[Any] = []
    if rules is not None:
        from grpo_monitor.core.rules import load_rules

        try:  # a broken rule file fails now, not mid-run
            loaded = load_rules(rules)
        except ValueError as exc:
            raise OptionError("attach(rules=...)", str(exc).removeprefix("rules: ")) from None
    try:
        costs = FindingCosts(gpu_hour_price, loaded)
    except ValueError as exc:
        raise OptionError("attach(gpu_hour_price=...)", str(exc).removeprefix("gpu_hour_price ")) from None

    supervised = env_state()
    directory = Path(supervised["run_dir"] or run_dir or default_run_dir(trainer))
    alone = place is None and not supervised["run_dir"]  # nothing but this script: no supervisor, no run_with_restarts
    if place is None:
        place = SegmentPlace(parent_run=supervised["parent_run"])
        if supervised["run_dir"]:
            place = SegmentPlace(segment=supervised["segment"], restarts_done=supervised["segment"],
                                 tried=supervised["tried"], applied_overrides=supervised["overrides"],
                                 lineage_root=directory.parent if supervised["segment"] > 0 else directory,
                                 parent_run=supervised["parent_run"])
            if restarts is None and supervised["auto_restart"]:
                restarts = RestartOptions()
            if restarts is not None and supervised["max_restarts"] is not None:
                restarts = dataclasses.replace(restarts, max_restarts=supervised["max_restarts"])
            _check_overrides_applied(trainer.args, supervised["overrides"])
    if gate is not None:
        from grpo_monitor.preflight.reward_gate import require_gate

        # Every rank checks, so all of them refuse together.
        logger.info("grpo-monitor: %s", require_gate(trainer, directory, gate.min_agreement))
    callback = MonitorCallback(
        trainer, directory, detectors=detectors, correctness_reward=correctness_reward, format_reward=format_reward,
        samples=samples, restarts=restarts, place=place, router=router, alerts=alert_opts, costs=costs, device=device,
    )
    if alone and restarts is not None:
        callback.restarts.relaunch_hint = relaunch_command(sys.argv)
    trainer.add_callback(callback)
    _watch_train(trainer, callback)
    if _is_main_process(trainer):
        _announce(callback, given, alert_opts)
    if dashboard and getattr(trainer.args, "process_index", 0) == 0:
        print(f"grpo-monitor: watch this run in another terminal with:  grpo-monitor watch {directory}")
    return callback
