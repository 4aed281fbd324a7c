"""The live scheduler, in four rooms; each imports only the rooms below it.

`store` (rows, migrations, the lease) <- `hosts` (executors, host scripts, inventory, telemetry)
<- `round` (one scheduling round: view, steps, deadlines, pending words) <- `surfaces` (CLI, HTTP API,
Prometheus, explain, eta, queries). `api` here is the HTTP API's factory at the path users' deployments name.
"""
