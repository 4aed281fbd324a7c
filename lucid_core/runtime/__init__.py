"""The live scheduler: state store, scheduling round, executors (SSH, local), telemetry agent, API and CLI."""
