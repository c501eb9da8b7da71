"""outbox's own machinery: what the public modules beside this package stand on, and no part of the API.

    connections/  how outbox reaches its database (engines, how a connection opens, which errors are its own
                  faults) and the providers' HTTP servers (the connection pools)
    config/       the settings' defaults and OUTBOX_ variables, the limits, the extras, a configured rate, and
                  where a provider's secret or token comes from when the code gives none
    checks/       what a registration or a request may hold: an event's payload, a provider's URL, a kind's
                  row in the database against its declaration in code
    redaction/    passwords and URL secrets hidden in every text and log line outbox or a library makes
    exports       the lazy re-exports of the packages' faces

An application imports the modules above this package (`outbox`, `outbox.db`, `outbox.testing`, ...); a name
in here may move or change in any release.
"""
