"""The surfaces room: what people and tools use (CLI, HTTP API, Prometheus, explain, eta, queries, submission).

May import every room below it (`round`, `hosts`, `store`); nothing in the runtime imports it back.
"""
