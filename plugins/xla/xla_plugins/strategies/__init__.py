"""XLA strategies: single device, multi-device (one worker per device) and SPMD."""
