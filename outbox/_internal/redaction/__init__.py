"""No secret shown: passwords and URL secrets found and replaced in a text (masking), and in every log record of
the process, whichever library makes it (log_records)."""
