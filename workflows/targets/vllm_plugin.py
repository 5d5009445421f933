"""vLLM general plugin: run NIXL without its UCX progress thread on the local CPU stack.

NIXL starts that thread with no pause between polls, and on CPU transports the UCX worker's event
fd stays readable, so each engine's thread spins a whole core even when idle (measured: 88% of a
core per engine after an hour idle; two engines starved this 2-core machine, releases took 25 min).
Without the thread, vLLM's own per-step transfer polling (get_notifs / check_xfer_state) drives
UCX. Inert unless PDOPS_NIXL_PROGRESS_THREAD=0, which only the local target sets.
"""

from __future__ import annotations

import os

SWITCH = "PDOPS_NIXL_PROGRESS_THREAD"


def register() -> None:
    if os.environ.get(SWITCH, "1") != "0":
        return
    from vllm.distributed import nixl_utils

    config = nixl_utils.nixl_agent_config  # vLLM loads NIXL lazily on first access
    if config is None or getattr(config, "pdops_no_progress_thread", False):
        return

    class NoProgressThreadConfig(config):  # type: ignore[misc, valid-type]
        pdops_no_progress_thread = True

        def __init__(self, *args, **kwargs):
            if not args:
                kwargs.setdefault("enable_prog_thread", False)
            super().__init__(*args, **kwargs)

    nixl_utils.nixl_agent_config = NoProgressThreadConfig
