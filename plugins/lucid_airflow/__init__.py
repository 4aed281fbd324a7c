"""Airflow glue of Lucid: the store connection, the drift notifier and the web plugin (views behind Airflow auth)."""
