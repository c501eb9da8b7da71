"""Settings and defaults: the settings' defaults and their OUTBOX_ variables (defaults), the limits the library
and the command share (limits), the optional parts and their extras (extras), a configured rate (rates), where a
provider's secret or token comes from when the code gives none (credentials)."""
