"""The example's settings: one app (this package, for its `seed_accounts` command), one URL, one database.

The database is OUTBOX_DATABASE_URL, the variable the `outbox` commands read; Django's PostgreSQL
backend uses psycopg 3, the connection `outbox.email.enqueue_email` takes.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy.engine import make_url


def database(url: str) -> dict[str, Any]:
    """Django's DATABASES entry for a PostgreSQL URL (postgresql://user:password@host:port/name)."""
    parsed = make_url(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parsed.database,
        "USER": parsed.username or "",
        "PASSWORD": parsed.password or "",
        # a Unix socket's folder comes as ?host=/path
        "HOST": parsed.host or parsed.query.get("host", ""),
        "PORT": str(parsed.port or ""),
    }


SECRET_KEY = "an example, not a secret"
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]
INSTALLED_APPS = ["examples.django_app"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "examples.django_app.urls"
USE_TZ = True
DATABASES = {"default": database(os.environ.get("OUTBOX_DATABASE_URL", "postgresql://localhost/outbox"))}
