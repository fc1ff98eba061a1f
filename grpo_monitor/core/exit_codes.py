"""The exit codes every ``grpo-monitor`` command shares, so a script tells them apart the same way everywhere.

- ``CLEAN`` (0): nothing to report (no warning or critical finding; the gate passed; the command did its work).
- ``FINDINGS`` (1): a finding a person should read (a warning or critical; lint: a critical; the gate: not
  passed or a reward function that disagreed with its reference).
- ``BAD_INPUT`` (2): unusable input (a path that does not exist or cannot be read, a malformed file or
  option), said in one line naming it.
- ``NOT_JUDGED`` (3): the input was read but no failure detector could judge it, or the run has not ended:
  never to be mistaken for a healthy run.
- ``ALERTS_NOT_SENT`` (4): ``analyze --alerts`` printed its report, but a verdict message was not confirmed
  delivered.

>>> int(ExitCode.NOT_JUDGED)
3
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    CLEAN = 0
    FINDINGS = 1
    BAD_INPUT = 2
    NOT_JUDGED = 3
    ALERTS_NOT_SENT = 4
