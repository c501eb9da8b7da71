"""Defaults and limits that the library and the `outbox` command both name, in a module that imports
nothing, so the command's help shows them without loading the database layer."""

# rows the retention purge deletes per transaction
PURGE_BATCH_SIZE = 5_000
# actions per page of `outbox list` (and `outbox.ops.list_actions`)
MAX_PAGE = 1_000
