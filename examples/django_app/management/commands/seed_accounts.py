"""`python -m examples.django_app seed_accounts`: the example's tables and two accounts, if missing."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.db import connection, transaction

from examples.accounts import schema

DEMO_ACCOUNTS = """
    INSERT INTO app_account (id, display_name, email, email_verified)
    VALUES (1, 'Alice', 'alice@example.com', true), (2, 'Bob', 'bob@example.com', true)
    ON CONFLICT (id) DO NOTHING
"""


class Command(BaseCommand):
    help = "Create the example's tables and two verified accounts, Alice (1) and Bob (2); keep what exists."

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(schema.TABLES)
            cursor.execute(DEMO_ACCOUNTS)
        self.stdout.write("tables and accounts 1 (Alice) and 2 (Bob) ready")
