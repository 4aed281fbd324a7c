"""The HTTP API's factory at the path deployments name (`lucid_core.runtime.api:create_app`).

The API lives in the surfaces room (`lucid_core.runtime.surfaces.api`); this module keeps the documented path.
"""

from lucid_core.runtime.surfaces.api import create_app

__all__ = ["create_app"]
