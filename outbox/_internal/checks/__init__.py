"""What a registration or a request may hold: an event kind's payload (event_payload), a registered provider's URL
(provider_urls), a kind's row in the database against its declaration in code (kind_rows)."""
