"""``grpo-monitor mcp``: the real server in a subprocess, driven by the official SDK's own stdio client. Each
tool returns what the matching ``--json`` prints; bad input is the tool's one-line error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from tests.test_analysis import write_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOOLS = {"analyze", "run_status", "findings", "recommendations", "compare"}


def _is_error(result) -> bool:
    return bool(result.is_error if hasattr(result, "is_error") else result.isError)


def session(calls):
    """Start the server as an agent would, list its tools, make each call; the results, in order."""
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    async def main():
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_MONITOR_")}
        params = StdioServerParameters(command=sys.executable, args=["-m", "grpo_monitor", "mcp"], cwd=str(ROOT),
                                       env=env)
        with open(os.devnull, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    listed = await s.list_tools()
                    out = []
                    for name, args in calls:
                        r = await s.call_tool(name, args)
                        out.append((_is_error(r), r.content[0].text))
                    return {t.name: t for t in listed.tools}, out

    return anyio.run(main)


def cli_json(*args) -> dict:
    out = subprocess.run([sys.executable, "-m", "grpo_monitor", *map(str, args), "--json"], capture_output=True,
                         text=True, cwd=ROOT)
    return json.loads(out.stdout)


def test_every_tool_is_listed_and_answers_as_the_cli_does(tmp_path):
    healthy = write_run(tmp_path / "healthy")
    collapsing = write_run(tmp_path / "collapsing", case="entropy_collapse", run_id="run-b")
    tools, results = session([
        ("analyze", {"paths": [str(healthy), str(collapsing)]}),
        ("run_status", {"path": str(collapsing)}),
        ("findings", {"paths": [str(collapsing)], "min_severity": "critical"}),
        ("findings", {"paths": [str(collapsing)], "min_severity": "info"}),
        ("recommendations", {"paths": [str(collapsing)]}),
        ("compare", {"paths": [str(healthy), str(collapsing)]}),
    ])
    assert set(tools) == TOOLS
    assert all(tools[name].description for name in TOOLS)
    assert "paths" in json.dumps(tools["analyze"].model_dump(by_alias=True))
    assert not [text for error, text in results if error]

    analyzed = json.loads(results[0][1])
    assert analyzed == cli_json("analyze", healthy, collapsing)
    assert [r["verdict"] for r in analyzed["runs"]] == ["healthy", "critical"]

    status = json.loads(results[1][1])
    assert status["source"] == str(collapsing) and status["verdict"] == "critical"
    assert status["seconds_since_write"] >= 0
    whole = {k: v for k, v in status.items() if k != "seconds_since_write"}
    assert whole == analyzed["runs"][1]

    critical, everything = (json.loads(results[i][1])["runs"][0] for i in (2, 3))
    assert critical["findings"] and all(f["severity"] == "critical" for f in critical["findings"])
    assert everything["findings"] == analyzed["runs"][1]["findings"]
    assert {f["detector"] for f in critical["findings"]} <= {f["detector"] for f in everything["findings"]}

    recs = json.loads(results[4][1])["runs"][0]
    assert recs["recommendations"] == analyzed["runs"][1]["recommendations"] and recs["recommendations"]

    assert json.loads(results[5][1]) == cli_json("compare", healthy, collapsing)


def test_bad_input_is_the_tools_one_line_error(tmp_path):
    run = write_run(tmp_path / "run")
    _, results = session([
        ("run_status", {"path": str(tmp_path / "missing")}),
        ("findings", {"paths": [str(run)], "min_severity": "loud"}),
        ("analyze", {"paths": []}),
        ("compare", {"paths": [str(run)]}),
        ("analyze", {"paths": [str(run)]}),  # the server is still answering after the errors
    ])
    errors = [text for error, text in results[:4] if error]
    assert len(errors) == 4, results
    assert f"{tmp_path / 'missing'}: no such file or directory" in errors[0]
    assert "min_severity: must be one of info, warning, critical, got 'loud'" in errors[1]
    assert "paths: give one or more run paths" in errors[2]
    assert all("\n" not in e and "Traceback" not in e for e in errors)
    assert results[4][0] is False and json.loads(results[4][1])["runs"][0]["verdict"] == "healthy"
