"""The chaos run's webhook receiver, a process of its own that the runner kills and restarts:
`python -m tests.chaos.receiver --port P --secret S --journal FILE`.

    start ──▶ FILE (webhook-id -> body, deliveries, receiver id), when it exists ──▶ the receiver's effects
    POST  ──▶ tests.webhook_receivers.Receiver ("ok": verify, one effect per webhook-id) ──▶ FILE rewritten

tests.webhook_receivers keeps its effects in memory and writes the journal after every delivery, before it
answers; this process starts from that journal, so a restart keeps deduplicating as a receiver's store
would: a webhook delivered before the kill and sent again after it is a second delivery, not a second effect.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from pathlib import Path

from tests.webhook_receivers import Effect, Receiver


def effects_of(journal: Path) -> dict[str, Effect]:
    """The effects a journal holds (none when it does not exist)."""
    if not journal.exists():
        return {}
    kept = json.loads(journal.read_text())
    return {
        msg_id: Effect(entry["body"].encode(), int(entry["deliveries"]), str(entry["receiver_id"]))
        for msg_id, entry in kept.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="a deduplicating webhook receiver that starts from its journal")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--journal", type=Path, required=True)
    arguments = parser.parse_args()
    receiver = Receiver(arguments.secret, journal=arguments.journal, port=arguments.port)
    receiver.effects.update(effects_of(arguments.journal))
    receiver.start()
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    stopped.wait()
    receiver.stop()


if __name__ == "__main__":
    main()
