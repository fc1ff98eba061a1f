import sys

from grpo_monitor.monitor.cli import main

sys.exit(main())
