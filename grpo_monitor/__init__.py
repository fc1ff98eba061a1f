"""grpo-monitor: training-time diagnostics and GRPO-variant recommendations for TRL ``GRPOTrainer`` runs.

The one import path users need, which no module of a training script (its own ``callbacks.py``,
``monitor.py`` or ``detectors.py``) can shadow::

    from grpo_monitor import attach
    attach(trainer)

    import grpo_monitor
    report = grpo_monitor.analyze("runs/my-run")

The code lives in the repository's top-level folders (``monitor/``, ``callbacks/``, ``detectors/``,
``fixtures/``) and is installed only as ``grpo_monitor.monitor``, ``grpo_monitor.callbacks``, ... .
Importing this package stays light: numpy and pandas, never torch, transformers or textual.

>>> import grpo_monitor
>>> sorted(grpo_monitor.__all__)[:4]
['Engine', 'Finding', 'RunContext', 'RunLog']
"""

from __future__ import annotations

import os as _os

# In a source checkout the four folders sit beside this one rather than inside it; a wheel installs them
# inside (setuptools' package-dir mapping in pyproject.toml). The checkout test is a file only the
# repository root has, so an installed copy never looks beyond its own folder.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isdir(_os.path.join(_root, "detectors")):
    __path__.append(_root)  # noqa: F821 - a package's own __path__
del _root

# The public API is the core package's curated one, re-exported rather than listed twice.
from grpo_monitor.monitor import *  # noqa: E402,F403 - the search path above must be in place first
from grpo_monitor.monitor import __all__  # noqa: E402
