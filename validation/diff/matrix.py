"""The built-in matrix: one case per request parameter (or meaningful combination) of the chat and
completions APIs, as the installed openai SDK and vLLM define them.

Every case is greedy (temperature 0) or seeded, asks for `return_token_ids` and a few tokens, so
answers compare token for token. `covers` names the request fields a case exercises; `UNCOVERED`
names the fields with no case and why. `coverage()` derives the field list from the installed
packages (openai `CompletionCreateParams*`, vLLM `ChatCompletionRequest` / `CompletionRequest`),
so a field that an upgrade adds shows up as neither covered nor explained
(tests/unit/test_diff.py fails on it).
"""
from __future__ import annotations

import functools
import typing

from validation.diff.models import Api, Case

MAX_TOKENS = 8
MSG = [{"role": "user", "content": "Tell me about prefill and decode."}]
PROMPT = "Prefill reads the prompt; decode writes the answer"
BASE = {"max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True}
# Half the tiny model's ordinary vocabulary (ids 3..4095): a stop id is then hit within a few tokens.
STOP_IDS = list(range(101, 4096, 2))
JSON_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL = {"type": "function", "function": {"name": "lookup", "description": "look a word up",
                                         "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                        "required": ["q"]}}}


def _case(api: Api, name: str, covers: list[str], **params) -> Case:
    """A body from the defaults and `params`; it is also sent streamed unless it streams already."""
    first = {"messages": MSG} if api == "chat" else {"prompt": PROMPT}
    body = {**first, **BASE, **params}
    for k in [k for k, v in body.items() if v is None]:  # None removes a default (e.g. max_tokens)
        del body[k]
    base_covers = ["model", "messages" if api == "chat" else "prompt"]
    return Case(name=f"{'chat' if api == 'chat' else 'cmpl'}_{name}", api=api, body=body,
                also_stream=not body.get("stream"), covers=base_covers + covers)


def _both(name: str, covers: list[str], **params) -> list[Case]:
    return [_case("chat", name, covers, **params), _case("completions", name, covers, **params)]


def _chat(name: str, covers: list[str], **params) -> list[Case]:
    return [_case("chat", name, covers, **params)]


def _cmpl(name: str, covers: list[str], **params) -> list[Case]:
    return [_case("completions", name, covers, **params)]


def _sampling() -> list[Case]:
    """Sampling, penalties and logit shaping, and every way a request stops."""
    out: list[Case] = []
    # -- the basics, streamed and not
    out += _both("greedy", ["max_tokens", "temperature", "return_token_ids", "stream", "stream_options"])
    out += _chat("max_completion_tokens", ["max_completion_tokens"], max_tokens=None, max_completion_tokens=6)
    out += _both("seed_sampling", ["seed", "top_p"], temperature=0.9, top_p=0.9, seed=1234)
    out += _both("n2_seed", ["n"], n=2, temperature=0.8, seed=7)
    out += _both("n2_greedy_rejected", ["n"], n=2)  # vLLM: n>1 needs temperature>0 (a 400)
    out += _both("top_k_min_p", ["top_k", "min_p"], temperature=1.0, seed=3, top_k=5, min_p=0.05)
    # -- penalties and logit shaping
    out += _both("frequency_penalty", ["frequency_penalty"], frequency_penalty=1.5, max_tokens=16)
    out += _both("presence_penalty", ["presence_penalty"], presence_penalty=1.5, max_tokens=16)
    out += _both("repetition_penalty", ["repetition_penalty"], repetition_penalty=1.3, max_tokens=16)
    out += _both("logit_bias", ["logit_bias"], logit_bias={"300": 100})
    out += _both("allowed_token_ids", ["allowed_token_ids"], allowed_token_ids=[300, 301, 500])
    out += _both("bad_words", ["bad_words"], bad_words=["the", "a"])
    out += _both("repetition_detection", ["repetition_detection"], max_tokens=24,
                 repetition_detection={"max_pattern_size": 2, "min_count": 2})
    # -- stopping
    out += _both("stop_string", ["stop"], stop=["e"], max_tokens=16)
    out += _both("stop_include", ["include_stop_str_in_output"], stop=["e"], include_stop_str_in_output=True,
                 max_tokens=16)
    out += _both("stop_token_ids", ["stop_token_ids"], stop_token_ids=STOP_IDS, max_tokens=16)
    out += _both("min_tokens", ["min_tokens"], min_tokens=4, stop_token_ids=STOP_IDS, max_tokens=16)
    out += _both("ignore_eos", ["ignore_eos"], ignore_eos=True, max_tokens=12)
    out += _both("max_tokens_omitted", [], max_tokens=None, stop_token_ids=STOP_IDS)
    # A prompt over several KV blocks (vLLM CPU: 128 tokens a block): P/D moves each block.
    out += _cmpl("long_prompt", [], prompt=" ".join([PROMPT] * 50))
    out += _chat("long_prompt", [], messages=[{"role": "user", "content": " ".join([PROMPT] * 50)}])
    return out


def _outputs() -> list[Case]:
    """What comes back besides the tokens: logprobs, structured outputs, beam search."""
    out: list[Case] = []
    # -- logprobs
    out += _chat("logprobs", ["logprobs", "top_logprobs"], logprobs=True, top_logprobs=3)
    out += _cmpl("logprobs", ["logprobs"], logprobs=3)
    out += _chat("logprobs_as_token_ids", ["return_tokens_as_token_ids"], logprobs=True, top_logprobs=2,
                return_tokens_as_token_ids=True)
    out += _cmpl("logprobs_as_token_ids", ["return_tokens_as_token_ids"], logprobs=2, return_tokens_as_token_ids=True)
    out += _chat("logprob_token_ids", ["logprob_token_ids"], logprobs=True, logprob_token_ids=[300, 500])
    out += _cmpl("logprob_token_ids", ["logprob_token_ids"], logprobs=1, logprob_token_ids=[300, 500])
    out += _both("prompt_logprobs", ["prompt_logprobs"], prompt_logprobs=2)
    # -- structured outputs
    out += _both("json_object", ["response_format"], response_format={"type": "json_object"}, max_tokens=16)
    out += _both("json_schema", ["response_format"], max_tokens=16,
                 response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": JSON_SCHEMA}})
    out += _both("structured_choice", ["structured_outputs"], structured_outputs={"choice": ["prefill", "decode"]})
    out += _both("structured_regex", ["structured_outputs"], structured_outputs={"regex": "[a-z]{3} [0-9]{2}"})
    # -- beam search
    out += _both("beam_search", ["use_beam_search", "length_penalty"], n=2, use_beam_search=True,
                 length_penalty=0.8, max_tokens=6)
    return out


def _request_fields() -> list[Case]:
    """Prompt handling and request bookkeeping fields, and bad input both sides must refuse alike."""
    out: list[Case] = []
    # -- prompt handling
    out += _both("truncate_prompt", ["truncate_prompt_tokens", "truncation_side"], truncate_prompt_tokens=5,
                 truncation_side="left")
    out += _both("add_special_tokens", ["add_special_tokens"], add_special_tokens=False)
    out += _both("special_tokens_out", ["skip_special_tokens", "spaces_between_special_tokens"],
                 skip_special_tokens=False, spaces_between_special_tokens=False, logit_bias={"2": 5})
    out += _both("cache_salt", ["cache_salt"], cache_salt="pdops-diff-salt-0123456789")
    out += _both("request_and_session_id", ["request_id", "session_id", "user"], request_id="pdops-diff-fixed-id",
                 session_id="pdops-diff-session", user="pdops-diff")
    out += _both("priority_rejected", ["priority"], priority=1)  # no priority scheduling: a 400
    out += _both("stream_interval", ["stream_interval"], stream=True, stream_interval=3,
                 stream_options={"include_usage": True})
    out += _both("continuous_usage", ["stream_options"], stream=True,
                 stream_options={"include_usage": True, "continuous_usage_stats": True})
    out += _both("thinking_budget", ["thinking_token_budget"], thinking_token_budget=4)
    out += _both("watermarking", ["watermarking"], watermarking=True)
    out += _both("render_only_fields", ["return_token_offsets", "mm_payload", "return_mm_kwargs",
                                        "routed_experts_prompt_start"],
                 return_token_offsets=True, mm_payload="none", routed_experts_prompt_start=0)
    # A client's own kv_transfer_params: the single engine has no connector and ignores it; a P/D
    # front end must refuse it or overwrite it, not fail (Ray asserts it is absent).
    out += _both("kv_transfer_params_from_client", ["kv_transfer_params"],
                 kv_transfer_params={"do_remote_decode": False})
    # -- bad input: both must refuse the same way
    out += _both("unknown_model", [], model="no-such-model")
    out += _both("negative_max_tokens", [], max_tokens=-1)
    out += _both("max_tokens_over_context", [], max_tokens=5000)
    out += _both("bad_temperature", [], temperature=-1)
    return out


def _completions_forms() -> list[Case]:
    """The completions API's prompt forms (batches, token ids, echo, suffix, best_of)."""
    out: list[Case] = []
    # -- completions prompt forms
    out += _cmpl("batch_prompts", [], prompt=[PROMPT, "Decode writes one token at a time"])
    out += _cmpl("token_prompt", [], prompt=[1, 300, 301, 500, 1000])
    out += _cmpl("batch_token_prompts", [], prompt=[[1, 300, 301], [1, 500, 1000, 200]])
    out += _cmpl("echo", ["echo"], echo=True)
    out += _cmpl("echo_logprobs", ["echo"], echo=True, logprobs=1)
    out += _cmpl("suffix", ["suffix"], suffix=" after")
    out += _cmpl("best_of", ["best_of"], best_of=2, n=1, temperature=0.7, seed=5)
    out += _cmpl("prompt_embeds_unsupported", ["prompt_embeds"], prompt=None, prompt_embeds="AAAA")
    out += _cmpl("empty_prompt", [], prompt="")
    return out


def _chat_forms() -> list[Case]:
    """The chat API's message and template forms, tools, and fields vLLM does not implement."""
    out: list[Case] = []
    # -- chat message and template forms
    out += _chat("content_parts", [], messages=[{"role": "user", "content": [
        {"type": "text", "text": "Tell me about"}, {"type": "text", "text": " prefill."}]}])
    out += _chat("multi_turn_system", [], messages=[{"role": "system", "content": "Be brief."}, *MSG,
                                                   {"role": "assistant", "content": "KV moves."},
                                                   {"role": "user", "content": "More?", "name": "ops"}])
    out += _chat("continue_final_message", ["continue_final_message", "add_generation_prompt"],
                messages=[*MSG, {"role": "assistant", "content": "Prefill is"}],
                continue_final_message=True, add_generation_prompt=False)
    out += _chat("echo", ["echo"], echo=True, messages=[*MSG, {"role": "assistant", "content": "Prefill is"}],
                continue_final_message=True, add_generation_prompt=False)
    # A request's own template is refused unless the server trusts them (vLLM 0.32:
    # --trust-request-chat-template): both must refuse, or both render it alike.
    out += _chat("chat_template", ["chat_template"],
                chat_template="{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}")
    out += _chat("chat_template_kwargs", ["chat_template_kwargs", "documents"],
                chat_template_kwargs={"extra": "Answer:"}, documents=[{"title": "kv", "text": "KV cache"}])
    out += _chat("return_prompt_text", ["return_prompt_text"], return_prompt_text=True)
    out += _chat("reasoning_fields", ["reasoning_effort", "include_reasoning"], reasoning_effort="low",
                include_reasoning=False)
    out += _chat("tool_named", ["tools", "tool_choice", "parallel_tool_calls"], tools=[TOOL], max_tokens=24,
                tool_choice={"type": "function", "function": {"name": "lookup"}}, parallel_tool_calls=False)
    out += _chat("tool_required", ["tools", "tool_choice"], tools=[TOOL], tool_choice="required", max_tokens=24)
    out += _chat("tool_none", ["tools", "tool_choice"], tools=[TOOL], tool_choice="none")
    out += _chat("tool_auto_unconfigured", ["tools", "tool_choice"], tools=[TOOL], tool_choice="auto")
    out += _chat("legacy_functions", ["functions", "function_call"], functions=[TOOL["function"]],
                function_call="none")
    # OpenAI platform fields vLLM does not implement: both sides must treat them alike.
    out += _chat("openai_platform_fields", ["metadata", "store", "service_tier", "safety_identifier",
                                           "prompt_cache_key", "prompt_cache_retention", "verbosity",
                                           "modalities", "prediction", "web_search_options"],
                metadata={"team": "pdops"}, store=False, service_tier="auto", safety_identifier="pdops-diff",
                prompt_cache_key="pdops-diff", prompt_cache_retention="in_memory", verbosity="low",
                modalities=["text"], prediction={"type": "content", "content": "Prefill"}, web_search_options={})
    out += _chat("empty_messages", [], messages=[])
    return out


def cases() -> list[Case]:
    """Every case of the built-in matrix, in a fixed order."""
    return [*_sampling(), *_outputs(), *_request_fields(), *_completions_forms(), *_chat_forms()]


# Fields with no case, and why. Keys: the API; a field both APIs share is listed under each.
_BOTH = {
    "ec_transfer_params": "encoder-cache disaggregation of multimodal models; the served model is text-only",
    "vllm_xargs": "arguments for custom logits processors; none is installed on either side",
}
UNCOVERED: dict[str, dict[str, str]] = {
    "chat": {**_BOTH,
             "audio": "audio output: a text model has none (vLLM ignores the field)",
             "moderation": "an OpenAI platform service with no vLLM counterpart; its value shape is not "
                           "documented in the SDK's TypedDict beyond a name",
             "prompt_cache_options": "an OpenAI platform option with no vLLM counterpart",
             "media_io_kwargs": "multimodal input loading; the served model is text-only",
             "mm_processor_kwargs": "multimodal processor arguments; the served model is text-only"},
    "completions": {**_BOTH},
}


def _typed_dict_fields(*types: type) -> set[str]:
    return {k for t in types for k in typing.get_type_hints(t)}


def schema_fields() -> dict[str, dict[str, set[str]]]:
    """Per API, the request fields of each installed schema: {"chat": {"openai": {...}, "vllm": {...}}}."""
    return {api: {src: set(f) for src, f in per.items()} for api, per in _schema_fields().items()}


@functools.lru_cache(maxsize=1)
def _schema_fields() -> dict[str, dict[str, set[str]]]:
    """Importing vLLM's protocol models costs about 10 s, once per process."""
    from openai.types import completion_create_params as cmpl
    from openai.types.chat import completion_create_params as chat

    out = {"chat": {"openai": _typed_dict_fields(chat.CompletionCreateParamsNonStreaming,
                                                 chat.CompletionCreateParamsStreaming)},
           "completions": {"openai": _typed_dict_fields(cmpl.CompletionCreateParamsNonStreaming,
                                                        cmpl.CompletionCreateParamsStreaming)}}
    try:  # vLLM 0.32 keeps the request models per endpoint
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    except ImportError:  # an image without vLLM (the Kubernetes step): the SDK's fields alone
        return out
    out["chat"]["vllm"] = set(ChatCompletionRequest.model_fields)
    out["completions"]["vllm"] = set(CompletionRequest.model_fields)
    return out


def coverage(fields: dict[str, dict[str, set[str]]] | None = None) -> dict[str, dict[str, list[str]]]:
    """Per API: fields `covered` by a case, `uncovered` with a reason, `unexplained` (neither: a
    new field of an upgraded package) and `stale` (explained or covered but in no schema)."""
    fields = schema_fields() if fields is None else fields
    all_cases = cases()
    out = {}
    for api, per_source in fields.items():
        known = set().union(*per_source.values())
        covered = {f for c in all_cases if c.api == api for f in c.covers}
        explained = set(UNCOVERED[api])
        out[api] = {"covered": sorted(covered & known), "uncovered": sorted(explained & known),
                    "unexplained": sorted(known - covered - explained),
                    "stale": sorted((covered | explained) - known) if "vllm" in per_source else []}
    return out
