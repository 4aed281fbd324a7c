"""Airflow plugin: mounts the Lucid views and JSON API at /lucid (behind Airflow auth) and adds them to the nav."""

from __future__ import annotations

from typing import ClassVar

from airflow.plugins_manager import AirflowPlugin
from lucid_airflow.connections import server_store_url
from lucid_airflow.tuning import reports_root
from lucid_airflow.web import NAV, create_lucid_app

URL_PREFIX = "/lucid"

lucid_app = create_lucid_app(server_store_url, reports_root, prefix=URL_PREFIX)


class LucidPlugin(AirflowPlugin):
    name = "lucid"
    fastapi_apps: ClassVar[list[dict]] = [{"app": lucid_app, "url_prefix": URL_PREFIX, "name": "Lucid scheduler"}]
    external_views: ClassVar[list[dict]] = [
        {"name": f"Lucid: {label}", "href": f"{URL_PREFIX}/{path}", "destination": "nav", "category": "Lucid",
         "url_route": f"lucid-{path}"}
        for path, label in NAV
    ]
