"""`pdops diff`: the candidate vs a single-engine reference, request by request (see command.py)."""
