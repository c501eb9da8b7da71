"""The example application's tables, created next to the outbox tables in one database."""

from sqlalchemy import Connection, text

TABLES = """
CREATE TABLE IF NOT EXISTS app_account (
    id             bigint PRIMARY KEY,
    display_name   text NOT NULL,
    email          text,                       -- null: the account has no address any more
    email_verified boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS app_workspace (
    id   bigint PRIMARY KEY,
    name text NOT NULL
);
CREATE TABLE IF NOT EXISTS app_membership (
    workspace_id bigint NOT NULL REFERENCES app_workspace,
    account_id   bigint NOT NULL REFERENCES app_account,
    role         text NOT NULL CHECK (role IN ('admin', 'member')),
    PRIMARY KEY (workspace_id, account_id)
);
CREATE TABLE IF NOT EXISTS app_unsubscription (
    account_id bigint NOT NULL REFERENCES app_account,
    notice     text NOT NULL,
    PRIMARY KEY (account_id, notice)
);
CREATE TABLE IF NOT EXISTS app_alert (
    id           bigint PRIMARY KEY,
    workspace_id bigint NOT NULL REFERENCES app_workspace,
    title        text NOT NULL,
    body         text NOT NULL
);
"""


def create(conn: Connection) -> None:
    conn.execute(text(TABLES))
