"""A minimal Django project that changes a row and enqueues an email in one transaction (see README.md)."""
