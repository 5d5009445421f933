"""`pdops`: one module per command group, registered by plain imports in main.py (the entry point
workflows.cli.main:main)."""
