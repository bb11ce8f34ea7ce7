"""The serving shell: gateway, admission, daemon, jobs and checkpoints around the core."""
