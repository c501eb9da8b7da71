"""Kinds that only tests and benchmarks use, registered through the same registry as EMAIL.

Step 1 of "Add a kind" happens here; step 2 is applied to the test template by `install_kinds`.
"""

from outbox.kinds import ActionKind

# does nothing; runs inside a workspace only
NOOP = ActionKind.register("TEST_NOOP", at_most_once=False, instance_level=False)
# an at-least-once kind that reads back before it writes; instance level only
READBACK = ActionKind.register("TEST_READBACK", at_most_once=False, instance_level=True, workspace_level=False)
# an at-most-once kind for executor tests that must not touch SMTP
ONCE = ActionKind.register("TEST_ONCE", at_most_once=True, instance_level=False)

# The installed test kinds (step 2 applied to the test template)
ALL = ActionKind.all()

# registered in code, never installed in the database: the enqueue tests' forgotten step 2
ROWLESS = ActionKind.register("TEST_ROWLESS", at_most_once=False, instance_level=False)
