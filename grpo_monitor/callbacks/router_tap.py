"""Routing diagnostics for mixture-of-experts models trained with GRPO.

``RouterTap`` puts a forward hook on every router of a transformers MoE model (found by
:func:`callbacks.moe_models.find_routers`: Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE, gpt-oss,
DeepSeek-V3 and others of the same build) and turns what the routers decide during the *training*
forward into a few numbers per logging step. Every ``probe_every`` steps it also replays a fixed probe
batch, taken from the run's own first training batch, and measures how many expert choices changed
since the previous probe: the routing volatility that makes per-token importance ratios noisy under
MoE (the reason GSPO exists).

Metrics returned by :meth:`RouterTap.collect` (all floats; loads and entropies cover the training
forwards since the previous ``collect``, counting non-padding tokens only):

``moe/load_cv``
    Mean over MoE layers of the coefficient of variation (std / mean) of expert load, where an
    expert's load is the number of (token, top-k slot) activations it received. 0 is perfect balance;
    ``sqrt(num_experts - 1)`` is everything on one expert.
``moe/load_max_over_mean``
    Max over layers of (busiest expert's load / mean load). 1 is perfect balance.
``moe/router_entropy``
    Mean over layers of the mean per-token entropy (nats) of the distribution the router uses:
    softmax over all experts (Qwen-MoE, Mixtral, OLMoE), softmax over the chosen top-k logits
    (gpt-oss, whose other experts get no mass), or the sigmoid affinities normalised to sum to one
    (DeepSeek-V3, which selects and weighs experts by those affinities).
``moe/router_entropy_normalized``
    The same, each layer divided by its maximum: ``log(num_experts)``, or ``log(top_k)`` for the
    top-k softmax. 1 is a router that does not prefer any expert.
``moe/tokens``
    Non-padding tokens counted (per layer; the largest layer count).
``moe/flip_rate``  (probe steps only, from the second probe on)
    Fraction of the probe batch's (token, expert) activations that are new since the previous probe,
    over all MoE layers: 0 when the routing did not move, 1 when every token changed all its experts.
``moe/flip_rate/layer_<i>``  (probe steps only)
    The same for decoder layer ``i``.
``moe/flip_rate_steps``  (probe steps only)
    Global steps between the two probes compared (the flip rate grows with it).

``tap.layer_loads`` holds, after each ``collect``, one list of load fractions per MoE layer (each
sums to 1, rounded to 4 decimals), for a heatmap; it is empty when nothing was counted.

What is recorded, and why it stays cheap:

* Only forwards that build an autograd graph are recorded: a pre-hook on the decoder that owns the
  routers notes ``torch.is_grad_enabled()`` at its entry and only then attaches the router hooks,
  which a post-hook detaches when the decoder returns. ``model.generate`` runs under
  ``torch.no_grad()`` (transformers decorates it), and so do TRL's old-policy and reference
  log-prob passes, so a decode step costs two decoder-level hook calls, not one per MoE layer. The
  decoder-level check (rather than one inside each router hook) keeps the training forward recorded
  under reentrant gradient checkpointing, which runs the layers with grad off.
* Gradient-checkpoint replays during backward find no router hook attached (and the hook would also
  skip itself: ``torch._C._current_graph_task_id()`` is -1 only outside a backward pass), so counts
  are the same with checkpointing on or off.
* The padding mask comes from the ``attention_mask`` passed to the decoder and is matched with the
  router's flattened ``batch * sequence`` tokens; when no 2-D mask matches, every token counts.
* Accumulation stays on the router's device in a few small tensors per layer (no ``.item()`` per hook
  call); ``collect`` synchronises once per device.
* The probe runs under ``torch.no_grad()`` in eval mode (train/eval flags restored exactly) and
  writes only its own buffers.

Example::

    tap = RouterTap.for_model(model, probe_every=10)   # None for a dense model
    if tap is not None:
        tap.install()
        ...                                           # training forwards
        metrics = tap.collect(step)                   # {"moe/load_cv": ..., ...}
        tap.remove()
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from grpo_monitor.callbacks.moe_models import RouterSpec, find_routers, moe_facts

__all__ = ["RouterTap", "moe_facts", "find_routers", "RouterSpec"]

logger = logging.getLogger("grpo_monitor")


def _unwrap(model: Any) -> Any:
    # DistributedDataParallel and similar wrappers keep the real model in ``.module``.
    seen = 0
    while isinstance(getattr(model, "module", None), torch.nn.Module) and seen < 4:
        model = model.module
        seen += 1
    return model


def _scope_name(router_names: list[str]) -> str:
    """Name of the module that owns the layer list holding the routers (the decoder)."""
    scopes = set()
    for name in router_names:
        parts = name.split(".")
        idx = next((i for i, p in enumerate(parts) if p.isdigit()), None)
        scopes.add(".".join(parts[: idx - 1]) if idx is not None and idx >= 1 else "")
    if len(scopes) == 1:
        return scopes.pop()
    return ""


def _token_entropy(logits: torch.Tensor, idx: torch.Tensor, kind: str) -> torch.Tensor:
    x = logits.float()
    if kind == "topk_softmax":
        logp = torch.log_softmax(x.gather(1, idx), dim=-1)
        return -(logp.exp() * logp).sum(-1)
    if kind == "sigmoid":
        s = torch.sigmoid(x)
        p = s / s.sum(-1, keepdim=True).clamp_min(1e-30)
        return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    logp = torch.log_softmax(x, dim=-1)
    return -(logp.exp() * logp).sum(-1)


class RouterTap:
    """Forward hooks on the routers of one MoE model; see the module docstring for the metrics."""

    def __init__(self, model: Any, routers: list[RouterSpec], *, probe_every: int | None = 10,
                 probe_rows: int = 4, probe_max_tokens: int = 256, message: str | None = None,
                 record_routing: bool = False) -> None:
        self.model = model
        self.routers = routers
        self.probe_every = int(probe_every) if probe_every else 0
        if self.probe_every < 0:
            raise ValueError(f"probe_every must be a positive number of steps or None, got {probe_every!r}")
        if probe_rows < 1 or probe_max_tokens < 1:
            raise ValueError("probe_rows and probe_max_tokens must be positive")
        self.probe_rows = int(probe_rows)
        self.probe_max_tokens = int(probe_max_tokens)
        self.message: str | None = None
        self._messages: set[str] = set()
        if message:
            self._note(message)
        #: When true, the last recorded training forward's ``(logits, top-k indices)`` per layer are
        #: kept in ``last_routing`` (detached): for checking the tap against a model's own outputs.
        self.record_routing = record_routing
        self.last_routing: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.layer_loads: list[list[float]] = []
        self.layers = [r.layer for r in routers]
        scope = _scope_name([r.name for r in routers]) if routers else ""
        self._scope: Any = model.get_submodule(scope) if routers else model
        self._handles: list[Any] = []
        self._router_handles: list[Any] = []
        self._hooks = [self._router_hook(pos) for pos in range(len(routers))]
        self._mode: str | None = None  # "train" | "probe" while a recorded forward runs
        self._probing = False
        self._valid: torch.Tensor | None = None
        self._disabled: set[int] = set()
        self._acc: dict[int, torch.Tensor] = {}  # router position -> [loads..., entropy sum, tokens]
        self._probe_sel: dict[int, torch.Tensor] = {}
        self._probe_batch: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self._probe_unavailable = False
        self._prev_probe: dict[int, torch.Tensor] | None = None
        self._prev_probe_step: int | None = None

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def for_model(cls, model: Any, probe_every: int | None = 10, **kwargs: Any) -> RouterTap | None:
        """A tap for ``model``, or None when it is not a mixture-of-experts model.

        An MoE model whose routers cannot be read gets a tap with no routers whose ``message`` says
        why (also logged once on the ``grpo_monitor`` logger); its ``collect`` returns ``{}``.
        """
        model = _unwrap(model)
        try:
            routers, problem = find_routers(model)
        except Exception as exc:  # a model we do not understand must never stop training
            config = getattr(model, "config", None)
            if config is None or not moe_facts(config)["is_moe"]:
                return None
            routers, problem = [], f"{type(model).__name__}: MoE routers could not be inspected ({exc!r}); MoE routing metrics are off"
        if not routers and problem is None:
            return None
        return cls(model, routers, probe_every=probe_every, message=problem, **kwargs)

    def _note(self, message: str) -> None:
        if message in self._messages:
            return
        self._messages.add(message)
        self.message = message if self.message is None else f"{self.message}; {message}"
        logger.info("grpo-monitor: %s", message)

    # -- hooks --------------------------------------------------------------------------------

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    def install(self) -> RouterTap:
        """Register the hooks (a second call does nothing).

        Only the decoder gets permanent hooks; the router hooks are attached at the start of each
        recorded forward and detached at its end, so a decode step pays two hook calls for the whole
        model instead of one per MoE layer, and a gradient-checkpoint replay finds no router hook.
        """
        if self._handles or not self.routers:
            return self
        self._handles.append(self._scope.register_forward_pre_hook(self._enter, with_kwargs=True))
        self._handles.append(self._scope.register_forward_hook(self._leave, always_call=True))
        return self

    def remove(self) -> None:
        """Remove every hook this tap registered."""
        self._detach()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._mode = None
        self._valid = None

    def _attach(self) -> None:
        if not self._router_handles:
            self._router_handles = [spec.module.register_forward_hook(self._hooks[pos])
                                    for pos, spec in enumerate(self.routers)]

    def _detach(self) -> None:
        for handle in self._router_handles:
            handle.remove()
        self._router_handles = []

    def _enter(self, module: Any, args: tuple, kwargs: dict) -> None:
        if self._probing:
            mode = "probe"
        elif torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1:
            mode = "train"
        else:
            self._mode = None
            return
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        ids = kwargs.get("input_ids", args[0] if args else None)
        valid = None
        if torch.is_tensor(mask) and mask.dim() == 2:
            valid = (mask != 0).reshape(-1).float()
        self._valid = valid
        self._mode = mode
        self._attach()
        if mode == "train" and self._probe_batch is None and not self._probe_unavailable and self.probe_every:
            self._capture_probe(ids, mask if valid is not None else None)

    def _leave(self, module: Any, args: tuple, output: Any) -> None:
        if self._mode is not None:
            self._detach()
        self._mode = None
        self._valid = None

    def _router_hook(self, pos: int):
        spec = self.routers[pos]

        def hook(module: Any, args: tuple, output: Any) -> None:
            mode = self._mode
            if mode is None or pos in self._disabled or torch._C._current_graph_task_id() != -1:
                return
            with torch.no_grad():
                parsed = self._parse(pos, output)
                if parsed is None:
                    return
                logits, idx = parsed
                if mode == "train":
                    self._accumulate(pos, spec, logits, idx)
                else:
                    self._probe_record(pos, spec, idx)

        return hook

    def _parse(self, pos: int, output: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        spec = self.routers[pos]
        n_exp = spec.num_experts
        logits = idx = None
        if isinstance(output, (tuple, list)) and len(output) >= 3 and torch.is_tensor(output[0]) \
                and torch.is_tensor(output[2]) and not output[2].is_floating_point():
            logits, idx = output[0], output[2]
        elif torch.is_tensor(output) and output.is_floating_point():
            logits = output
        if logits is None or logits.shape[-1] != n_exp or (idx is not None and idx.shape[-1] != spec.top_k):
            self._disabled.add(pos)
            self._note(f"router {spec.name} returned an output the tap cannot read "
                       f"({type(output).__name__}); layer {spec.layer} is left out of the MoE metrics")
            return None
        logits = logits.detach().reshape(-1, n_exp)
        if idx is None:
            # A router that returns bare logits selects the top-k of them (softmax and sigmoid are monotone).
            idx = logits.topk(spec.top_k, dim=-1).indices
        idx = idx.detach().reshape(logits.shape[0], spec.top_k).long()
        return logits, idx

    def _valid_for(self, n_tokens: int, device: torch.device) -> torch.Tensor | None:
        valid = self._valid
        if valid is None or valid.numel() != n_tokens:
            return None
        return valid.to(device, non_blocking=True)

    def _accumulate(self, pos: int, spec: RouterSpec, logits: torch.Tensor, idx: torch.Tensor) -> None:
        n_tokens, n_exp = logits.shape
        acc = self._acc.get(pos)
        if acc is None or acc.device != logits.device:
            acc = self._acc[pos] = torch.zeros(n_exp + 2, dtype=torch.float32, device=logits.device)
        ent = _token_entropy(logits, idx, spec.kind)
        valid = self._valid_for(n_tokens, logits.device)
        flat = idx.reshape(-1)
        if valid is None:
            acc[:n_exp].index_add_(0, flat, torch.ones(flat.shape[0], dtype=torch.float32, device=flat.device))
            acc[n_exp] += ent.sum()
            acc[n_exp + 1] += n_tokens
        else:
            acc[:n_exp].index_add_(0, flat, valid.repeat_interleave(spec.top_k))
            acc[n_exp] += (ent * valid).sum()
            acc[n_exp + 1] += valid.sum()
        if self.record_routing:
            self.last_routing[spec.layer] = (logits.clone(), idx.clone())

    # -- probe --------------------------------------------------------------------------------

    def _capture_probe(self, ids: Any, mask: torch.Tensor | None) -> None:
        if not torch.is_tensor(ids) or ids.dim() != 2 or ids.is_floating_point():
            self._probe_unavailable = True
            self._note("the training forward passes no token ids, so the routing flip rate is not measured")
            return
        rows = min(self.probe_rows, ids.shape[0])
        cols = max(1, min(ids.shape[1], self.probe_max_tokens // rows))
        ids = ids[:rows, :cols]
        mask = mask[:rows, :cols] if mask is not None else None
        if mask is not None:
            # Drop columns that are padding in every kept row (left-padded prompts), so the probe's
            # token budget goes to real tokens.
            keep = (mask != 0).any(dim=0)
            first = int(keep.float().argmax()) if bool(keep.any()) else 0
            ids, mask = ids[:, first:], mask[:, first:]
        self._probe_batch = (ids.detach().clone(), None if mask is None else mask.detach().clone())

    def _probe_record(self, pos: int, spec: RouterSpec, idx: torch.Tensor) -> None:
        sel = torch.zeros(idx.shape[0], spec.num_experts, dtype=torch.bool, device=idx.device)
        sel.scatter_(1, idx, True)
        self._probe_sel[pos] = sel

    def _run_probe(self) -> dict[int, torch.Tensor] | None:
        ids, mask = self._probe_batch
        states = [(m, m.training) for m in self._scope.modules()]
        kwargs: dict[str, Any] = {"input_ids": ids}
        if mask is not None:
            kwargs["attention_mask"] = mask
        self._probe_sel = {}
        self._probing = True
        try:
            self._scope.eval()
            with torch.no_grad():
                try:
                    self._scope(use_cache=False, **kwargs)
                except TypeError:
                    self._scope(**kwargs)
        except Exception as exc:  # the probe is a diagnostic: it must never stop training
            self._probe_unavailable = True
            self._note(f"the routing probe forward failed ({exc!r}); the routing flip rate is not measured")
            return None
        finally:
            self._probing = False
            self._mode = None
            self._detach()
            for m, training in states:
                m.training = training
        valid = (mask != 0).reshape(-1) if mask is not None else None
        out = {}
        for pos, sel in self._probe_sel.items():
            out[pos] = sel if valid is None or valid.numel() != sel.shape[0] else sel[valid.to(sel.device)]
        self._probe_sel = {}
        return out

    def _probe_due(self, step: int) -> bool:
        if not self.probe_every or self._probe_batch is None or self._probe_unavailable:
            return False
        last = self._prev_probe_step
        if last is None or step < last:
            return True
        return step // self.probe_every > last // self.probe_every

    def _probe_metrics(self, step: int) -> dict[str, float]:
        last_step = self._prev_probe_step
        if last_step is not None and step < last_step:
            self._prev_probe = None  # the run went back (resumed from a checkpoint): start a new baseline
        sel = self._run_probe()
        if sel is None:
            return {}
        prev, self._prev_probe, self._prev_probe_step = self._prev_probe, sel, step
        if prev is None:
            return {}
        common = [pos for pos in sel if pos in prev and prev[pos].shape == sel[pos].shape]
        if not common:
            return {}
        per_layer = []
        for pos in common:
            cur, old = sel[pos], prev[pos]
            per_layer.append(torch.stack([(cur & ~old).sum(), cur.sum()]).float().cpu())
        metrics: dict[str, float] = {}
        changed = total = 0.0
        for pos, pair in zip(common, per_layer):
            c, t = float(pair[0]), float(pair[1])
            changed += c
            total += t
            if t > 0:
                metrics[f"moe/flip_rate/layer_{self.routers[pos].layer}"] = c / t
        if total > 0:
            metrics["moe/flip_rate"] = changed / total
            metrics["moe/flip_rate_steps"] = float(step - last_step) if last_step is not None else float("nan")
        return metrics

    # -- per logging step ---------------------------------------------------------------------

    def _drain(self) -> dict[int, list[float]]:
        by_device: dict[torch.device, list[int]] = {}
        for pos, acc in self._acc.items():
            by_device.setdefault(acc.device, []).append(pos)
        values: dict[int, list[float]] = {}
        for positions in by_device.values():
            flat = torch.cat([self._acc[p] for p in positions]).cpu()  # the one synchronisation per device
            offset = 0
            for p in positions:
                n = self._acc[p].numel()
                values[p] = flat[offset:offset + n].tolist()
                offset += n
                self._acc[p].zero_()
        return values

    def collect(self, step: int) -> dict[str, float]:
        """Summaries since the previous call (then reset), plus the flip rate when a probe is due."""
        if not self.routers:
            return {}
        metrics: dict[str, float] = {}
        values = self._drain()
        cvs, max_over_mean, ents, ents_norm, tokens = [], [], [], [], []
        loads: list[list[float]] = []
        for pos, spec in enumerate(self.routers):
            v = values.get(pos)
            n_exp = spec.num_experts
            if v is None or v[n_exp + 1] <= 0:
                if pos not in self._disabled:
                    loads.append([0.0] * n_exp)
                continue
            counts = v[:n_exp]
            total = sum(counts)
            mean = total / n_exp
            std = math.sqrt(sum((c - mean) ** 2 for c in counts) / n_exp)
            cvs.append(std / mean)
            max_over_mean.append(max(counts) / mean)
            ent = v[n_exp] / v[n_exp + 1]
            ents.append(ent)
            ents_norm.append(ent / spec.entropy_max)
            tokens.append(v[n_exp + 1])
            loads.append([round(c / total, 4) for c in counts])
        if tokens:
            metrics["moe/load_cv"] = sum(cvs) / len(cvs)
            metrics["moe/load_max_over_mean"] = max(max_over_mean)
            metrics["moe/router_entropy"] = sum(ents) / len(ents)
            metrics["moe/router_entropy_normalized"] = sum(ents_norm) / len(ents_norm)
            metrics["moe/tokens"] = float(max(tokens))
            self.layer_loads = loads
        else:
            self.layer_loads = []
        if self._probe_due(step):
            metrics.update(self._probe_metrics(step))
        return metrics

    def __repr__(self) -> str:
        kinds = sorted({r.kind for r in self.routers})
        return (f"RouterTap(layers={self.layers}, experts={self.routers[0].num_experts if self.routers else None}, "
                f"top_k={self.routers[0].top_k if self.routers else None}, kind={kinds}, installed={self.installed})")
