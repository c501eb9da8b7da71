"""Metrics: the database-derived collector and the exporter process that serves it to Prometheus."""
