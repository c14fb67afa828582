"""Command-line entry points of the chaos module (registered in service/cli.py)."""
