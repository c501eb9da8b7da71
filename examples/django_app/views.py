"""The Django example: change an account's address and enqueue "verify your address" in one transaction.

    POST /accounts/{id}/email  {"email": ...}   Idempotency-Key: <the client's id for this change>

    with transaction.atomic():
        UPDATE app_account (new address, unverified)          through connection.cursor()
        enqueue_email(connection.connection, VERIFY_ADDRESS, event)   the same psycopg connection
        the address taken by another account? raise: 409
    ─▶ commit: the row and the action together; any exception out of atomic(): neither

`django.db.connection.connection` is the psycopg 3 connection Django holds; inside `atomic()` it is in
Django's open transaction, so outbox writes the action in it. Outside `atomic()` Django runs in
autocommit and outbox refuses it (`outbox.OutboxError`): the action would commit apart from the change.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from examples.accounts.notices import VERIFY_ADDRESS  # importing the notices registers them
from outbox import Action
from outbox.email import enqueue_email

ADDRESS = re.compile(r"[^@\s]+@[^@\s]+")


class NoAccount(Exception):
    pass


class AddressTaken(Exception):
    pass


@csrf_exempt  # an API for programs, not a form in a browser
@require_POST
def change_email(request: HttpRequest, account_id: int) -> JsonResponse:
    """Give the account a new, unverified address and ask it to verify the address, in one transaction."""
    key = request.headers.get("Idempotency-Key", "")
    if not 0 < len(key) <= 200:
        return JsonResponse({"detail": "send an Idempotency-Key header of 1 to 200 characters"}, status=400)
    try:
        email = json.loads(request.body)["email"]
    except (ValueError, TypeError, KeyError):
        return JsonResponse({"detail": 'send {"email": "..."}'}, status=400)
    if not isinstance(email, str) or len(email) > 254 or not ADDRESS.fullmatch(email):
        return JsonResponse({"detail": f"not an address: {email!r}"}, status=400)
    try:
        action = _change_email(account_id, email, key)
    except NoAccount:
        return JsonResponse({"detail": f"no account {account_id}"}, status=404)
    except AddressTaken:
        return JsonResponse({"detail": f"{email} belongs to another account"}, status=409)
    return JsonResponse(
        # the verification email: ADMITTED now, sent by a worker once the transaction has committed
        {"account_id": account_id, "email": email, "action_id": action.id, "action_state": action.state.value}
    )


def _change_email(account_id: int, email: str, key: str) -> Action:
    # An exception that leaves atomic() rolls it back; returning from inside it would commit.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE app_account SET email = %s, email_verified = false WHERE id = %s RETURNING id",
            [email, account_id],
        )
        if cursor.fetchone() is None:
            raise NoAccount()
        event: dict[str, Any] = {"account_id": account_id, "request": key}
        action = enqueue_email(connection.connection, VERIFY_ADDRESS, event)
        # The last check runs after the enqueue on purpose: whatever fails before the commit, even after
        # enqueue_email has returned, takes the email away with the change.
        cursor.execute("SELECT EXISTS (SELECT 1 FROM app_account WHERE email = %s AND id <> %s)", [email, account_id])
        if cursor.fetchone()[0]:
            raise AddressTaken()
    return action
