"""`python -m examples.fastapi_app --database-url URL`: create the example's tables and accounts, then serve.

The URL defaults to OUTBOX_DATABASE_URL, as for the `outbox` commands; migrate that database first with
`outbox db upgrade`.
"""

from __future__ import annotations

import argparse
import os

import uvicorn
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from examples.fastapi_app.app import create_app, seed


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.fastapi_app", description=__doc__)
    parser.add_argument("--database-url", default=os.environ.get("OUTBOX_DATABASE_URL"))
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    if not args.database_url:
        parser.error("pass --database-url or set OUTBOX_DATABASE_URL (the database `outbox db upgrade` migrated)")
    engine = create_engine(make_url(args.database_url).set(drivername="postgresql+psycopg"))
    with engine.begin() as conn:
        seed(conn)
    engine.dispose()
    uvicorn.run(create_app(args.database_url), host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
