"""``python -m grpo_monitor``: the ``grpo-monitor`` command."""

import sys

from grpo_monitor.monitor.cli import main

sys.exit(main())
