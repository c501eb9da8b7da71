"""`python -m examples.django_app COMMAND`: the example project's manage.py (`seed_accounts`, `runserver`)."""

import os
import sys

from django.core.management import execute_from_command_line

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
    execute_from_command_line(sys.argv)
