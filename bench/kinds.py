"""The kinds the benchmarks use, registered through the same registry as EMAIL (step 1 of "Add a kind").

Step 2 is applied to each benchmark database by `outbox.testing.install_kinds(conn, ALL)`. The name and the
declaration are the tests' (tests/kinds.py): registering the same declaration twice is harmless, and the
benchmarks' SQL names TEST_NOOP.
"""

from outbox.kinds import ActionKind

# does nothing; runs inside a workspace only
NOOP = ActionKind.register("TEST_NOOP", at_most_once=False, instance_level=False)

ALL = ActionKind.all()
