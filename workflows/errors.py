"""The input and dependency errors every command prints (file, field, fix; exit 2 / 1).

They are defined in validation/errors.py because validation/ is the lower layer (it imports
nothing of workflows/) and raises them too; workflows code imports them from here.
"""
from __future__ import annotations

from validation.errors import InputError, MissingDependency

__all__ = ["InputError", "MissingDependency"]
