"""The applications: the `grpo-monitor` command line, the live dashboard, the demo, the supervisor, the reward-gate screen."""
