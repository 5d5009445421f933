"""The release spec: what platform teams edit (overlays/<env>/release.yaml) and the pinned facts it is read with.

Bottom of the flow spec -> render -> checks -> targets -> pipeline -> argo -> cli: imports only workflows.errors
and workflows.names (contract: pyproject.toml [tool.importlinter]).
"""
