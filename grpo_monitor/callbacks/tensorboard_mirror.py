"""Findings where TensorBoard users look: a scalar per detector state (a flat line at 0 is healthy) and the
findings as text, written into the trainer's own event file."""

from __future__ import annotations

from typing import Any

from grpo_monitor.core.recommend import title as rec_title

STATE_CODES = {"warming_up": 0.0, "ok": 0.0, "warning": 1.0, "critical": 2.0, "disabled": -1.0}


class TensorBoardMirror:
    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self._writer: Any = None  # found on first use; False when the trainer has no TensorBoard

    def write(self, step: int, states: dict[str, str], findings: list[Any], recs: list[dict[str, Any]]) -> None:
        writer = self._find_writer()
        if writer is None:
            return
        for det, st in states.items():
            writer.add_scalar(f"grpo_monitor/{det}", STATE_CODES.get(st, 0.0), step)
        if findings:
            text = "\n\n".join(
                f"**[{f.severity}] {f.detector}** at step {f.step}"
                + (f" (onset ~{f.onset_step})" if f.onset_step is not None else "") + f": {f.message}"
                for f in findings)
            text += "".join((f"\n\nRecommended **{r['variant']}**" if r.get("status") == "recommended"
                             else f"\n\n**{rec_title(r)}**") + f": `{r['python']}` — `{r['cli_flags']}`" for r in recs)
            writer.add_text("grpo_monitor/findings", text, step)
        writer.flush()

    def _find_writer(self) -> Any:
        if self._writer is None:
            from transformers.integrations import TensorBoardCallback

            self._writer = next((cb.tb_writer for cb in self.trainer.callback_handler.callbacks
                                 if isinstance(cb, TensorBoardCallback) and getattr(cb, "tb_writer", None) is not None),
                                False)
        return self._writer or None
