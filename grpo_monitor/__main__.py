"""``python -m grpo_monitor``: the ``grpo-monitor`` command."""

import sys

from grpo_monitor.app.cli import main

sys.exit(main())
