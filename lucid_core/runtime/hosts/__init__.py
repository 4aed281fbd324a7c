"""The hosts room: executors (SSH, local), the scripts and claims run on hosts, inventory, NVML telemetry.

May import the `store` room; never `round` or `surfaces`. What a host or a job writes is parsed here, defensively.
"""
