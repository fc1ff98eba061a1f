"""Pre-flight: what is checked before training starts (the reward-inspection gate and its screen).

Nothing is imported here eagerly: the gate's model (``reward_gate``) is light, its screen
(``gate_app``) needs Textual and is opened by the command line only.
"""
