"""One REAL vLLM (CPU build) engine serving the locally built tiny model, shared by the integration
tests (compat, bench, diff): about a minute to start on 2 cores, so it starts once per session."""
from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def real_vllm(tmp_path_factory) -> Iterator[str]:
    """The local target's single-engine reference server (the golden-token check's), on its own:
    its OpenAI base URL (`http://127.0.0.1:PORT/v1`)."""
    from workflows.spec.tiny_model import build
    from workflows.targets.local_stack import ReferenceEngine

    engine = ReferenceEngine(tmp_path_factory.mktemp("vllm"), _free_port(), str(build("pdops-tiny")), "pdops-tiny",
                             {"enforce_eager": True, "max_model_len": 1024})
    with engine:
        engine.wait_ready(lambda _: None, timeout_s=600)
        yield engine.base_url
