"""What the README and docs/ tell a new user must be true of the code it describes."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_monitor.app.cli import _parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _subparsers():
    parser = _parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices


def _commands(text: str):
    """Each ``grpo-monitor VERB ...`` written in a doc, up to the end of its code span or line."""
    for m in re.finditer(r"grpo-monitor ([a-z-]+)((?: [^`\n|#;]*)?)", text):
        yield m.group(1), m.group(2)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_flag_a_doc_gives_a_verb_exists(doc):
    verbs = _subparsers()
    wrong = []
    for verb, rest in _commands(doc.read_text()):
        if verb not in verbs:
            continue  # prose such as "grpo-monitor watches"
        known = {s for a in verbs[verb]._actions for s in a.option_strings}
        own = (" " + rest).split(" -- ")[0]  # after " -- " come the wrapped command's own flags
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9_-]*)", own):
            if flag not in known:
                wrong.append(f"grpo-monitor {verb} {flag}")
    assert wrong == [], f"{doc.name} names flags the CLI does not have"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_no_doc_cites_a_file_outside_the_repository(doc):
    # The repository is read on its own: a citation of a section of some other document is a dead end.
    assert not re.search(r"REFERENCE\s*§", doc.read_text())


def test_readme_python_imports_exist():
    import importlib

    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    imports = [line for b in blocks for line in b.splitlines() if line.startswith(("from grpo_monitor", "import grpo_monitor"))]
    assert imports
    for line in imports:
        m = re.match(r"from ([\w.]+) import (.+)", line)
        if m:
            mod = importlib.import_module(m.group(1))
            for name in re.split(r",\s*", m.group(2).split("#")[0].strip()):
                assert hasattr(mod, name), line
        else:
            importlib.import_module(line.split()[1])


def test_readme_says_how_to_get_the_cpu_torch_wheel_and_the_makefile_takes_it():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"make demo TORCH_INDEX=(\S+?)`", text)
    assert m, "the README names the CPU-only index for the set-up"
    dry = subprocess.run(["make", "-n", "-B", "setup", f"TORCH_INDEX={m.group(1)}", "PYTHON=python3"], cwd=ROOT,
                         capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    torch_line = next(line for line in dry.stdout.splitlines() if "torch==" in line)
    assert f"--index-url {m.group(1)}" in torch_line
    plain = subprocess.run(["make", "-n", "-B", "setup", "PYTHON=python3"], cwd=ROOT, capture_output=True, text=True)
    assert "--index-url" not in next(line for line in plain.stdout.splitlines() if "torch==" in line)
    assert re.search(r"`make test` (takes )?about \d+ minutes", text)


def test_the_demo_scenarios_the_readme_lists_are_the_cli_s():
    from grpo_monitor.app.demo import SCENARIOS

    text = (ROOT / "README.md").read_text()
    listed = re.search(r"--scenario \{([a-z_,]+)\}", text).group(1).split(",")
    assert set(listed) == set(SCENARIOS)


def test_the_walkthrough_script_runs_the_readme_commands_in_order():
    """tests/readme_walkthrough.sh is the README's commands as a script (run by hand on a fresh clone): the
    commands it runs must be the ones the README documents, with their documented exit codes."""
    script = (ROOT / "tests" / "readme_walkthrough.sh").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / "tests" / "readme_walkthrough.sh")]).returncode == 0
    verbs = _subparsers()
    for line in script.splitlines():
        m = re.match(r'step "?([0-9 ]+)"? [\w-]+ grpo-monitor (\S+) (.*)', line)
        if not m:
            continue
        verb, args = m.group(2), shlex.split(m.group(3).replace('"$', '"X').replace("$", "X"))
        args = args[:args.index("--")] if "--" in args else args
        assert verb in verbs, line
        known = {s for a in verbs[verb]._actions for s in a.option_strings}
        assert all(a in known for a in args if a.startswith("--")), line
    assert "step 0 make-demo make demo" in script and "make test" in script


def test_cli_help_runs_for_every_verb():
    for verb in _subparsers():
        out = subprocess.run([sys.executable, "-m", "grpo_monitor", verb, "--help"], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0 and "usage:" in out.stdout, verb
