"""``grpo-monitor mcp``: the monitor's offline engine as Model Context Protocol tools over stdio, so a coding
agent driving a run can ask what a human asks the CLI.

Tools (each returns the JSON the matching ``--json`` prints, as text):

- ``analyze(paths)``: ``grpo-monitor analyze PATH... --json``.
- ``run_status(path)``: one run as ``analyze --json`` gives it (a live run too: its status says whether it is
  still being written), with ``seconds_since_write`` for a run directory.
- ``findings(paths, min_severity)``: each run's findings at or above a severity, with its verdict.
- ``recommendations(paths)``: each run's recommendations (the ``GRPOConfig`` diffs and their flags).
- ``compare(paths)``: ``grpo-monitor compare PATH... --json``.

A path that cannot be read, or a bad argument, is a tool error with the same one line the CLI prints; nothing
here writes to stdout, which carries the protocol. The server needs the ``mcp`` extra
(``pip install 'grpo-monitor[mcp]'``: the official SDK, 1.x or 2.x).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SEVERITIES = ("info", "warning", "critical")
TOOLS = ("analyze", "run_status", "findings", "recommendations", "compare")


class ToolError(ValueError):
    """A tool's one-line refusal (the agent sees it as the tool's error)."""


def _sdk() -> tuple[Any, type[Exception]]:
    """The SDK's server class and the error it reports to the client as the tool's own message."""
    try:  # mcp 2.x
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError as SdkToolError

        return MCPServer, SdkToolError
    except ImportError:  # mcp 1.x
        from mcp.server.fastmcp import FastMCP
        from mcp.server.fastmcp.exceptions import ToolError as SdkToolError

        return FastMCP, SdkToolError


def _paths(paths: str | Sequence[str]) -> list[str]:
    given = [paths] if isinstance(paths, str) else list(paths or [])
    if not given or not all(isinstance(p, str) and p for p in given):
        raise ToolError("paths: give one or more run paths (run directories, trainer_state.json, exports, logs)")
    return given


def report_json(paths: str | Sequence[str]) -> dict[str, Any]:
    """``analyze --json``'s document for ``paths``; a path that cannot be read is a ``ToolError`` naming it."""
    from grpo_monitor.analysis.analyze import analyze
    from grpo_monitor.app.analyze_cmd import json_text
    from grpo_monitor.readers import SourceError

    unreadable: list[str] = []
    try:
        report = analyze(_paths(paths), on_unreadable=unreadable.append)
    except SourceError as exc:
        raise ToolError(str(exc)) from None
    if not report.runs and not report.errors:
        raise ToolError("; ".join(unreadable) or f"{', '.join(_paths(paths))}: no run could be read")
    return json.loads(json_text(report))


def run_status(path: str) -> dict[str, Any]:
    """One run's entry of ``analyze --json``, with how long ago a run directory's log was last written."""
    doc = report_json([path])
    if len(doc["runs"]) != 1:
        raise ToolError(f"{path}: holds {len(doc['runs'])} runs; give one of them "
                        f"({', '.join(r['source'] for r in doc['runs'][:4])})")
    run = doc["runs"][0]
    log = Path(run.get("file") or path)
    log = log / "run.jsonl" if log.is_dir() else log
    if log.is_file():
        run["seconds_since_write"] = round(time.time() - log.stat().st_mtime, 1)
    return run


def findings(paths: str | Sequence[str], min_severity: str = "warning") -> dict[str, Any]:
    if min_severity not in SEVERITIES:
        raise ToolError(f"min_severity: must be one of {', '.join(SEVERITIES)}, got {min_severity!r}")
    floor = SEVERITIES.index(min_severity)
    doc = report_json(paths)
    return {"runs": [{"source": r["source"], "verdict": r.get("verdict"),
                      "findings": [f for f in r.get("findings", [])
                                   if f.get("severity") in SEVERITIES and SEVERITIES.index(f["severity"]) >= floor]}
                     for r in doc["runs"]]}


def recommendations(paths: str | Sequence[str]) -> dict[str, Any]:
    doc = report_json(paths)
    return {"runs": [{"source": r["source"], "verdict": r.get("verdict"),
                      "recommendations": r.get("recommendations", [])} for r in doc["runs"]]}


def compare(paths: str | Sequence[str]) -> dict[str, Any]:
    from grpo_monitor.app.compare_cmd import compare_json

    try:
        return compare_json(_paths(paths))
    except ToolError:
        raise
    except ValueError as exc:  # fewer than two runs, a path that cannot be read: the CLI's one line
        raise ToolError(str(exc)) from None


def build_server() -> Any:
    """The MCP server with grpo-monitor's tools registered."""
    server_class, sdk_error = _sdk()

    def _as_text(make: Any, *args: Any) -> str:
        try:
            return json.dumps(make(*args), allow_nan=False, default=str)
        except ToolError as exc:  # the client sees this one line as the tool's error
            raise sdk_error(str(exc)) from None

    server = server_class("grpo-monitor", log_level="WARNING", instructions=(
        "Diagnose GRPO training runs (TRL GRPOTrainer and other trainers' logs): verdicts, findings with their "
        "evidence, recommended GRPOConfig changes, and comparisons between runs. Paths are run directories, "
        "trainer_state.json files, TensorBoard folders, CSV/JSONL exports or console logs on this machine."))

    @server.tool(name="analyze", structured_output=False)
    def analyze_tool(paths: list[str]) -> str:
        """Analyse runs as `grpo-monitor analyze PATH... --json` does: per run its verdict, findings with
        evidence, recommendations (GRPOConfig diffs), coverage (which detectors could judge it) and status."""
        return _as_text(report_json, paths)

    @server.tool(name="run_status", structured_output=False)
    def run_status_tool(path: str) -> str:
        """One run's status, verdict and findings (a live run too: `status` says whether it is still being
        written; `seconds_since_write` how long ago its log last grew)."""
        return _as_text(run_status, path)

    @server.tool(name="findings", structured_output=False)
    def findings_tool(paths: list[str], min_severity: str = "warning") -> str:
        """Each run's findings at or above `min_severity` (info, warning or critical), with the run's verdict."""
        return _as_text(findings, paths, min_severity)

    @server.tool(name="recommendations", structured_output=False)
    def recommendations_tool(paths: list[str]) -> str:
        """Each run's recommended changes: the variant, the GRPOConfig overrides, the CLI flags and why."""
        return _as_text(recommendations, paths)

    @server.tool(name="compare", structured_output=False)
    def compare_tool(paths: list[str]) -> str:
        """Compare two or more runs as `grpo-monitor compare PATH... --json` does (a restarted run's lineage:
        its segments): each run's verdict and findings, the config difference, and what differs per finding."""
        return _as_text(compare, paths)

    return server


def serve() -> None:
    """Serve the tools on stdin/stdout until the client closes them."""
    build_server().run("stdio")
