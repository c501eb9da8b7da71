"""`python -m outbox.cli`: the `outbox` command without the installed script."""

from outbox.cli import main

main()
