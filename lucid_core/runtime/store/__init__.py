"""The store room: the rows (schema and migrations), the Store, and the lease that fences every round's writes.

The bottom room: it imports no other room of the runtime (only `lucid_core.config` and `lucid_core.domain`).
"""
