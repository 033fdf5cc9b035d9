"""Which of llama.cpp's server tests shoal is not expected to pass, and why (read by llama_adapter.py).

`SKIPS` maps a test id pattern (fnmatch, relative to llama.cpp's `tools/server/tests/`) to the
llama-server-only feature the test exercises; each such test is skipped with that reason. What is left is
the OpenAI surface: those tests must pass. `KNOWN_DEFECTS` marks tests that fail because of a defect of
shoal's (xfail, not strict, printed in the summary with its outcome): fix the defect, then remove the entry.
Tests marked `slow` by llama.cpp are skipped for `SLOW`. An entry that matches no collected test is printed.
"""

SLOW = "marked slow: needs the hub models it names (7B and up), run by llama.cpp only with SLOW_TESTS"

# The reasons shared by many entries.
NATIVE = ("llama-server's native routes (/completion, /completions, /tokenize, /slots, /props, /apply-template), "
          "not OpenAI's")
STORIES = "exact text, token counts or ids of llama.cpp's own test model (stories260K / bert-bge-small)"
CLI = "a llama-server command-line flag"

SKIPS: "dict[str, str]" = {
    # --- test_basic.py
    "unit/test_basic.py::test_server_multiple_addresses": f"{CLI} (--host with two addresses) and {NATIVE}",
    "unit/test_basic.py::test_server_props": "/props",
    "unit/test_basic.py::test_server_slots": "/slots",
    "unit/test_basic.py::test_load_split_model": f"{CLI} (--hf-file of a split GGUF) and {NATIVE}",
    "unit/test_basic.py::test_no_ui": f"{CLI} (--no-ui) and llama-server's own web UI at /",
    "unit/test_basic.py::test_server_model_aliases_and_tags": f"{CLI} (--alias, --tags): the models list's aliases/tags",
    # --- test_chat_completion.py
    "unit/test_chat_completion.py::test_chat_completion[[]*": STORIES + ", and system_fingerprint 'b<build>'",
    "unit/test_chat_completion.py::test_chat_completion_cached_tokens": STORIES + " (prompt and cached token counts)",
    "unit/test_chat_completion.py::test_chat_completion_stream[[]*": STORIES + ", and system_fingerprint 'b<build>'",
    "unit/test_chat_completion.py::test_chat_completion_with_openai_library": STORIES + ", and system_fingerprint 'b<build>'",
    "unit/test_chat_completion.py::test_chat_template": f"{CLI} (--chat-template) and its `__verbose` prompt echo",
    "unit/test_chat_completion.py::test_chat_template_assistant_prefill[[]*": f"{CLI} (--chat-template-file) and `__verbose`",
    "unit/test_chat_completion.py::test_chat_template_continue_final_message_vllm_compat":
        f"{CLI} (--chat-template-file) and `__verbose`",
    "unit/test_chat_completion.py::test_chat_template_continue_final_message_mutual_exclusion":
        "`add_generation_prompt` / `continue_final_message`: vLLM's and llama-server's parameters, not OpenAI's",
    "unit/test_chat_completion.py::test_apply_chat_template": "/apply-template and --chat-template command-r",
    # json_object with a `schema` inside: llama-server's extension (OpenAI's json_object takes no schema).
    "unit/test_chat_completion.py::test_completion_with_response_format[[]response_format0-*":
        "`response_format: {type: json_object, schema}`: llama-server's extension",
    "unit/test_chat_completion.py::test_completion_with_response_format[[]response_format1-*":
        "`response_format: {type: json_object, schema}`: llama-server's extension",
    "unit/test_chat_completion.py::test_completion_with_response_format[[]response_format5-*":
        "`response_format: {type: json_object, schema}`: llama-server's extension",
    "unit/test_chat_completion.py::test_completion_with_response_format[[]response_format6-*":
        "`response_format: {type: json_object, schema}`: llama-server's extension",
    "unit/test_chat_completion.py::test_completion_with_response_format[[]response_format7-*":
        "`response_format: {type: json_object, schema}`: llama-server's extension",
    "unit/test_chat_completion.py::test_completion_with_json_schema[[]*": "the top-level `json_schema` parameter",
    "unit/test_chat_completion.py::test_completion_with_grammar[[]*": "the `grammar` parameter (GBNF)",
    "unit/test_chat_completion.py::test_completion_with_invalid_grammar": "the `grammar` parameter (GBNF)",
    "unit/test_chat_completion.py::test_invalid_chat_completion_req[[]messages7]":
        "two assistant turns in a row refused (its templates need alternation); OpenAI accepts them",
    "unit/test_chat_completion.py::test_chat_completion_with_timings_per_token": "its `timings` object",
    "unit/test_chat_completion.py::test_logprobs_stream":
        "first chunk's delta content null; OpenAI's first chunk carries role and content \"\"",
    "unit/test_chat_completion.py::test_logit_bias": "/tokenize (the test tokenizes its banned words there)",
    "unit/test_chat_completion.py::test_context_size_exceeded": f"{CLI} (--ctx-size 512) and its exceed_context_size_error",
    "unit/test_chat_completion.py::test_context_size_exceeded_stream":
        f"{CLI} (--ctx-size 512) and its exceed_context_size_error",
    "unit/test_chat_completion.py::test_return_progress[[]*": "the `return_progress` parameter (prompt_progress events)",
    "unit/test_chat_completion.py::test_chat_completions_token_count": "/chat/completions/input_tokens",
    "unit/test_chat_completion.py::test_verbose_debug": "the `verbose` parameter (`__verbose`)",
    # --- test_completion.py: every test but two uses the native /completion route; those two assert stories text.
    "unit/test_completion.py::test_completion_with_openai_library": STORIES + ", and system_fingerprint 'b<build>'",
    "unit/test_completion.py::test_completion_stream_with_openai_library": STORIES,
    "unit/test_completion.py::test_completion[[]*": NATIVE,
    "unit/test_completion.py::test_completion_stream[[]*": NATIVE,
    "unit/test_completion.py::test_completion_stream_vs_non_stream": NATIVE,
    "unit/test_completion.py::test_consistent_result_same_seed[[]*": NATIVE,
    "unit/test_completion.py::test_different_result_different_seed[[]*": NATIVE,
    "unit/test_completion.py::test_consistent_result_different_batch_size[[]*": NATIVE,
    "unit/test_completion.py::test_cache_vs_nocache_prompt": NATIVE + " (and skipped by llama.cpp itself)",
    "unit/test_completion.py::test_nocache_long_input_prompt": NATIVE,
    "unit/test_completion.py::test_json_prompt_no_mtmd": NATIVE,
    "unit/test_completion.py::test_json_prompt_mtm_error_when_not_supported": NATIVE,
    "unit/test_completion.py::test_completion_with_tokens_input": NATIVE,
    "unit/test_completion.py::test_completion_parallel_slots[[]*": NATIVE,
    "unit/test_completion.py::test_completion_unified[[]*": f"{NATIVE}; {CLI} (--kv-unified)",
    "unit/test_completion.py::test_completion_response_fields[[]*": NATIVE,
    "unit/test_completion.py::test_n_probs": "n_probs, " + NATIVE,
    "unit/test_completion.py::test_n_probs_stream": "n_probs, " + NATIVE,
    "unit/test_completion.py::test_n_probs_post_sampling": "n_probs, " + NATIVE,
    "unit/test_completion.py::test_n_probs_post_backend_sampling": "n_probs, " + NATIVE,
    "unit/test_completion.py::test_logit_bias[[]*": NATIVE,
    "unit/test_completion.py::test_cancel_request": NATIVE,
    "unit/test_completion.py::test_completion_prompt_cache": NATIVE,
    # --- test_tool_call.py (the forced-call tests on the tiny model are commented out upstream)
    "unit/test_tool_call.py::test_completion_without_tool_call_fast[[]*-CompletionMode.STREAMED]":
        "utils.make_any_request refuses an empty content delta, which OpenAI's first chunk (role, content \"\") is",
    # --- test_embedding.py
    "unit/test_embedding.py::test_embedding_mixed_input[[]-False]": "an empty string embedded (OpenAI refuses it)",
    "unit/test_embedding.py::test_embedding_mixed_input[[]input3-False]": "strings mixed into a token array",
    "unit/test_embedding.py::test_embedding_mixed_input[[]input5-True]": "strings and token arrays in one input",
    "unit/test_embedding.py::test_embedding_mixed_input[[]input7-True]": "strings mixed into a token array",
    "unit/test_embedding.py::test_embedding_mixed_input[[]input8-False]": "`{prompt_string}` input objects",
    "unit/test_embedding.py::test_embedding_mixed_input[[]input9-False]": "`{content: [parts]}` input objects",
    "unit/test_embedding.py::test_embedding_mixed_input[[]input10-True]": "`{prompt_string}` / `{content}` input objects",
    "unit/test_embedding.py::test_embedding_content_text_same_as_string": "`{content: [parts]}` input objects",
    "unit/test_embedding.py::test_embedding_pooling_none": f"{CLI} (--pooling none) and its native /embeddings",
    "unit/test_embedding.py::test_embedding_pooling_none_oai": f"{CLI} (--pooling none)",
    "unit/test_embedding.py::test_embedding_error_prompt_too_long": f"{CLI} (--ctx-size 512; shoal's context is the model's)",
    "unit/test_embedding.py::test_embedding_usage_single[[]*": STORIES,
    "unit/test_embedding.py::test_embedding_usage_multiple": STORIES,
    # --- test_security.py
    "unit/test_security.py::test_access_static_assets_without_api_key": "its web UI's asset paths",
    "unit/test_security.py::test_incorrect_api_key[[]*":
        NATIVE + "; also its 401 type authentication_error (OpenAI: invalid_request_error, code invalid_api_key)",
    "unit/test_security.py::test_correct_api_key": NATIVE,
    "unit/test_security.py::test_correct_api_key_anthropic_header": NATIVE,
    "unit/test_security.py::test_openai_library_correct_api_key":
        f"{CLI} (--n-predict 64) bounds its chat sent without max_tokens; sampled, the 135M model runs on to the "
        "context's end (minutes; OpenAI sets no default). The API key on OpenAI's routes: tests/python/test_api_keys.py",
    "unit/test_security.py::test_cors_options[[]*":
        f"{CLI} (--cors-origins) on its native /completions (shoal's own CORS policy: tests/python/test_web_origins.py)",
    "unit/test_security.py::test_cors_origins_localhost_reflects[[]*": f"{CLI} (--cors-origins localhost)",
    "unit/test_security.py::test_cors_origins_localhost_rejects[[]*": f"{CLI} (--cors-origins localhost)",
    "unit/test_security.py::test_cors_origins_defaults_to_localhost_with_tools_enabled": f"{CLI} (--tools)",
    "unit/test_security.py::test_cors_proxy_only_forwards_explicit_proxy_headers": f"{CLI} (--ui-mcp-proxy), /cors-proxy",
    "unit/test_security.py::test_local_media_file[[]*": f"{CLI} (--media-path) and file:// images",
    # --- test_compat_oai_responses.py
    "unit/test_compat_oai_responses.py::test_responses_with_openai_library": STORIES,
    "unit/test_compat_oai_responses.py::test_responses_stream_with_llama_telemetry":
        "its unprefixed /responses route and its telemetry fields in Responses events",
    # --- test_compat_anthropic.py
    "unit/test_compat_anthropic.py::test_anthropic_tool_result_with_image":
        "its 500 'image input is not supported' for a text-only model (shoal: 400 invalid_request_error)",
    "unit/test_compat_anthropic.py::test_anthropic_vision_format_accepted":
        "its 500 'image input is not supported' for a text-only model (shoal: 400 invalid_request_error)",
    "unit/test_compat_anthropic.py::test_anthropic_vision_base64_with_multimodal_model":
        f"{CLI} (-hf of a multimodal model with its mmproj)",
    "unit/test_compat_anthropic.py::test_anthropic_empty_messages":
        "an empty `messages` accepted (its permissive choice; Anthropic answers 400, as shoal does)",
    "unit/test_compat_anthropic.py::test_anthropic_thinking_history_in_count_tokens":
        f"{CLI} (--chat-template-file of Qwen3) for thinking blocks in the history",
    "unit/test_compat_anthropic.py::test_anthropic_thinking_history_in_template":
        f"{CLI} (--chat-template-file of Qwen3) and /apply-template",
}

KNOWN_DEFECTS: "dict[str, str]" = {}
