"""A FastAPI application that changes a row and enqueues an email in one transaction (see README.md)."""

from examples.fastapi_app.app import create_app, seed

__all__ = ["create_app", "seed"]
