"""The vLLM plugin that switches NIXL's spinning progress thread off, on the real vLLM and NIXL."""

import pytest

from workflows.targets import vllm_plugin

nixl_utils = pytest.importorskip("vllm.distributed.nixl_utils")


@pytest.fixture
def restored(monkeypatch):
    monkeypatch.setattr(nixl_utils, "nixl_agent_config", nixl_utils.nixl_agent_config)
    return monkeypatch


def test_inert_without_the_switch(restored):
    restored.delenv(vllm_plugin.SWITCH, raising=False)
    original = nixl_utils.nixl_agent_config
    vllm_plugin.register()
    assert nixl_utils.nixl_agent_config is original
    assert original(num_threads=4).enable_pthread is True


def test_switch_turns_the_progress_thread_off_and_keeps_other_settings(restored):
    restored.setenv(vllm_plugin.SWITCH, "0")
    vllm_plugin.register()
    vllm_plugin.register()  # vLLM loads plugins in several places of one process
    config = nixl_utils.nixl_agent_config(num_threads=4, capture_telemetry=True)
    assert config.enable_pthread is False
    assert (config.num_threads, config.capture_telemetry) == (4, True)
    assert nixl_utils.nixl_agent_config(enable_prog_thread=True).enable_pthread is True
    assert [c.__name__ for c in nixl_utils.nixl_agent_config.__mro__] == [  # wrapped once
        "NoProgressThreadConfig", "nixl_agent_config", "object"]
