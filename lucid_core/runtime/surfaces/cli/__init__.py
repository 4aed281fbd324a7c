"""`lucid` subcommands of the live scheduler (`commands.add_parser`), one module per area: jobs, fleet, rounds.

Part of the surfaces room; `context` holds what the commands share (the store, the executor, output).
"""
