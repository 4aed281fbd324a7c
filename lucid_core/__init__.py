"""Lucid: a non-intrusive, interpretable GPU training-job scheduler (plain library, no Airflow)."""

__version__ = "0.1.0"
