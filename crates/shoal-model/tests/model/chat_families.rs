//! Chat templates of every family shoal runs render as llama.cpp renders them.
//!
//! The real templates are third-party files and are not in this repository; these tests use small
//! templates written for shoal that use each construct the real ones depend on (Llama 3.x, Mistral,
//! Qwen 2.5, Qwen 3, Gemma 2/3, Phi-3), with the outputs llama.cpp's engine gives for them.
//!
//! Checked against llama.cpp itself with `scripts/reference/chat_templates_check.py` on 2026-11-24
//! (llama.cpp source tree at /work/llama.cpp: llama-server 0.5.0-dev, ggml 0.25.3, its own
//! `common/jinja` engine, `--jinja --chat-template-file`, `/apply-template`): the templates
//! meta-llama-Llama-3.1-8B-Instruct, meta-llama-Llama-3.2-3B-Instruct, meta-llama-Llama-3.3-70B-Instruct,
//! mistralai-Mistral-Nemo-Instruct-2407, Qwen-Qwen2.5-7B-Instruct, Qwen-Qwen3-0.6B,
//! google-gemma-2-2b-it, microsoft-Phi-3.5-mini-instruct and HuggingFaceTB-SmolLM3-3B, each served with
//! SmolLM2-135M (BOS not added) and with Gemma 3 270M (BOS added), on 10 conversations (system + user,
//! user/assistant/user, with and without a system turn, one user message with and without the
//! generation prompt, unicode and newlines, padded and empty content, a `developer` turn, a history
//! with a `<think>` block, two user turns in a row): all 180 renders byte-identical (the refusals of
//! non-alternating turns by Mistral and Gemma included). Each template of this file was run through
//! the same script (`--templates-dir`) with both models and matched too, except `tojson(sort_keys=true)`,
//! which llama.cpp refuses when it loads the template and shoal when it renders it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use shoal_model::chat::{AddedSpecials, ChatMessage, ChatTemplate, ChatTemplateError, Thinking};

fn msgs(turns: &[(&str, &str)]) -> Vec<ChatMessage> {
    turns
        .iter()
        .map(|(r, c)| ChatMessage::new(*r, *c))
        .collect()
}

/// 2024-07-05 08:09:03 UTC.
fn july_fifth() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_720_166_943)
}

fn render(
    src: &str,
    turns: &[(&str, &str)],
    generation: bool,
) -> Result<String, ChatTemplateError> {
    let t = ChatTemplate::new(src, "<s>", "</s>").expect("compiles");
    t.render_at(&msgs(turns), generation, july_fifth())
}

fn ok(src: &str, turns: &[(&str, &str)], generation: bool) -> String {
    render(src, turns, generation).expect("renders")
}

/// Gemma 2/3: BOS, turns renamed (`assistant` -> `model`), content trimmed, alternation enforced with
/// `raise_exception`, a system turn refused by the template itself.
const GEMMA_LIKE: &str = "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}\
{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('roles must alternate') }}{% endif %}\
{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}\
{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}\
{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";

#[test]
fn gemma_like_turns_trim_and_alternation() {
    let out = ok(
        GEMMA_LIKE,
        &[("user", " Hi\n"), ("assistant", "Hello "), ("user", "Bye")],
        true,
    );
    assert_eq!(
        out,
        "<s><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    );
    match render(GEMMA_LIKE, &[("user", "a"), ("user", "b")], true) {
        Err(ChatTemplateError::Raised { message }) => assert_eq!(message, "roles must alternate"),
        other => panic!("expected the template's exception, got {other:?}"),
    }
}

/// A system turn then a user's "Hi", rendered on 2024-07-05 with the generation prompt.
fn system_then_hi(t: &ChatTemplate) -> String {
    t.render_at(
        &msgs(&[("system", "Be brief."), ("user", "Hi")]),
        true,
        july_fifth(),
    )
    .expect("renders")
}

/// The template never reads a system message's content, so (as llama.cpp does) the system message is
/// put in front of the first user message, with a newline; alone, it is dropped.
#[test]
fn system_turn_merges_into_the_next_when_the_template_ignores_it() {
    let t = ChatTemplate::new(GEMMA_LIKE, "<bos>", "<eos>").expect("compiles");
    assert!(!t.supports_system_role());
    let out = system_then_hi(&t);
    assert_eq!(
        out,
        "<bos><start_of_turn>user\nBe brief.\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
    // llama.cpp cuts the BOS text off when its tokenizer adds BOS by itself.
    let added = AddedSpecials {
        bos: true,
        eos: false,
    };
    let applied = t
        .apply_at(&msgs(&[("user", "Hi")]), true, added, july_fifth())
        .expect("renders");
    assert_eq!(
        applied,
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
    // A template that reads the system content keeps the system turn.
    let chatml = ChatTemplate::new(CHATML_LIKE, "", "").expect("compiles");
    assert!(chatml.supports_system_role());
}

/// gpt-oss's template formats today's date (`strftime_now`, one of llama.cpp's globals) before it
/// reads the system message as the developer message: the system role is supported (the probe has the
/// clock), so the system turn is not merged into the user's.
#[test]
fn a_harmony_like_system_turn_becomes_the_developer_message() {
    const HARMONY_LIKE: &str = "<|start|>system<|message|>Current date: {{ strftime_now('%Y-%m-%d') }}<|end|>\
{% if messages[0].role == 'system' %}<|start|>developer<|message|>{{ messages[0].content }}<|end|>\
{% set rest = messages[1:] %}{% else %}{% set rest = messages %}{% endif %}\
{% for m in rest %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}\
{% if add_generation_prompt %}<|start|>assistant{% endif %}";
    let t = ChatTemplate::new(HARMONY_LIKE, "<|startoftext|>", "<|return|>").expect("compiles");
    assert!(t.supports_system_role());
    let out = system_then_hi(&t);
    assert_eq!(
        out,
        "<|start|>system<|message|>Current date: 2024-07-05<|end|>\
         <|start|>developer<|message|>Be brief.<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant"
    );
}

const CHATML_LIKE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// `developer` (OpenAI's newer name for the system role) is read as `system`.
#[test]
fn developer_role_is_system() {
    let out = ok(
        CHATML_LIKE,
        &[("developer", "Rules."), ("user", "Hi")],
        false,
    );
    assert_eq!(
        out,
        "<|im_start|>system\nRules.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
}

/// Llama 3.x: today's date from `date_string` (given, as llama.cpp gives it) or `strftime_now`,
/// system message pulled out of the list with a slice, `'tool_calls' in message`, `tools` undefined.
const LLAMA3_LIKE: &str = "{{- bos_token }}\n\
{%- if not date_string is defined %}{%- set date_string = \"26 Jul 2024\" %}{%- endif %}\n\
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}\n\
{%- if messages[0]['role'] == 'system' %}\n\
    {%- set system_message = messages[0]['content']|trim %}\n\
    {%- set messages = messages[1:] %}\n\
{%- else %}\n\
    {%- set system_message = \"\" %}\n\
{%- endif %}\n\
{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n\
{%- if tools is not none %}{{- \"Environment: ipython\\n\" }}{%- endif %}\n\
{{- \"Today Date: \" + date_string + \" (\" + strftime_now(\"%A %H:%M\") + \", \" + datetime + \")\\n\\n\" }}\n\
{{- system_message }}{{- \"<|eot_id|>\" }}\n\
{%- for message in messages %}\n\
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n\
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n\
    {%- endif %}\n\
{%- endfor %}\n\
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}\n";

#[test]
fn llama3_like_dates_and_system_extraction() {
    let out = ok(
        LLAMA3_LIKE,
        &[("system", " Be kind. "), ("user", "Hi\n")],
        true,
    );
    assert_eq!(
        out,
        "<s><|start_header_id|>system<|end_header_id|>\n\n\
         Today Date: 05 Jul 2024 (Friday 08:09, Jul 05 2024)\n\n\
         Be kind.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

/// `strftime_now` is defined (Llama 3.2 asks before calling it) and `date_string` is today's date.
#[test]
fn strftime_now_and_date_string_are_today() {
    let src = "{% if strftime_now is defined %}{{ strftime_now('%Y-%m-%d') }}|{{ date_string }}{% endif %}";
    let t = ChatTemplate::new(src, "", "").expect("compiles");
    let out = t.render(&[], true).expect("renders");
    let (ymd, dmy) = out.split_once('|').expect("two dates");
    let fields: Vec<&str> = ymd.split('-').collect();
    assert_eq!(fields.len(), 3, "{out}");
    let year: i32 = fields[0].parse().expect("year");
    assert!(year >= 2025, "{out}");
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month: usize = fields[1].parse().expect("month");
    assert_eq!(
        dmy,
        format!("{} {} {}", fields[2], MONTHS[month - 1], fields[0])
    );
    // An empty result is an error in llama.cpp (C strftime's 0), and here.
    let empty = ChatTemplate::new("{{ strftime_now('') }}", "", "").expect("compiles");
    assert!(matches!(
        empty.render(&[], true),
        Err(ChatTemplateError::Render { .. })
    ));
}

/// Qwen 3: a namespace with keyword arguments, the messages walked backwards with `[::-1]`, `<think>`
/// blocks cut out of history with `split`, `lstrip`, `rstrip`, `strip`, and `enable_thinking`.
const QWEN3_LIKE: &str = "\
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == \"user\" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == \"user\" %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == \"assistant\" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in message.content %}
            {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
            {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}";

#[test]
fn qwen3_like_history_and_thinking() {
    let t = ChatTemplate::new(QWEN3_LIKE, "", "").expect("compiles");
    // Its output depends on `enable_thinking`, so thinking is on (no empty think block).
    assert!(t.enable_thinking());
    let turns = [
        ("user", "2+2?"),
        ("assistant", "<think>\nEasy.\n</think>\n\nFour."),
        ("user", "3+3?"),
    ];
    let out = t
        .render_at(&msgs(&turns), true, july_fifth())
        .expect("renders");
    assert_eq!(
        out,
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\nFour.<|im_end|>\n\
         <|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n"
    );
    // The assistant turn after the last user query keeps its reasoning.
    let out = t
        .render_at(&msgs(&turns[..2]), false, july_fifth())
        .expect("renders");
    assert_eq!(
        out,
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nEasy.\n</think>\n\nFour.<|im_end|>\n"
    );
    // A template that does not look at `enable_thinking` gets false.
    let plain = ChatTemplate::new(CHATML_LIKE, "", "").expect("compiles");
    assert!(!plain.enable_thinking());
}

/// A request turns thinking off (or on) for the render, whatever the template's default, and its
/// `reasoning_effort` reaches the templates that read it (gpt-oss).
#[test]
fn a_request_sets_enable_thinking_and_reasoning_effort() {
    let t = ChatTemplate::new(QWEN3_LIKE, "", "").expect("compiles");
    let turns = msgs(&[("user", "3+3?")]);
    let render = |thinking: &Thinking| {
        t.render_thinking_at(&turns, &[], true, july_fifth(), thinking)
            .expect("renders")
    };
    let off = Thinking {
        enable: Some(false),
        effort: None,
        budget: None,
    };
    assert!(render(&off).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    let default = render(&Thinking::default());
    assert!(default.ends_with("<|im_start|>assistant\n"), "{default}");
    assert_eq!(
        render(&Thinking {
            enable: Some(true),
            effort: None,
            budget: None,
        }),
        default
    );
    let effort = ChatTemplate::new(
        "Reasoning: {{ reasoning_effort | default('medium') }}",
        "",
        "",
    )
    .expect("compiles");
    let high = Thinking {
        enable: None,
        effort: Some("high".into()),
        budget: None,
    };
    assert_eq!(
        effort
            .render_thinking_at(&turns, &[], true, july_fifth(), &high)
            .expect("renders"),
        "Reasoning: high"
    );
    assert_eq!(
        effort
            .render_at(&turns, true, july_fifth())
            .expect("renders"),
        "Reasoning: medium"
    );
}

/// Mistral: `selectattr(..., "equalto", ...) | list`, a namespace counter, comparing a message with
/// the last user message, `system_message` put into the last user turn.
const MISTRAL_LIKE: &str = "\
{%- if messages[0][\"role\"] == \"system\" %}
    {%- set system_message = messages[0][\"content\"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr(\"role\", \"equalto\", \"user\") | list %}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if (message[\"role\"] == \"user\") != (ns.index % 2 == 0) %}
        {{- raise_exception(\"After the optional system message, conversation roles must alternate\") }}
    {%- endif %}
    {%- set ns.index = ns.index + 1 %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message[\"role\"] == \"user\" %}
        {%- if message == user_messages[-1] %}{{- \"[LAST]\" }}{%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}
        {%- else %}
            {{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}
        {%- endif %}
    {%- elif message[\"role\"] == \"assistant\" %}
        {{- message[\"content\"] + eos_token}}
    {%- endif %}
{%- endfor %}";

#[test]
fn mistral_like_selectattr_namespace_and_system() {
    let out = ok(
        MISTRAL_LIKE,
        &[
            ("system", "Sys"),
            ("user", "A"),
            ("assistant", "B"),
            ("user", "C"),
        ],
        true,
    );
    assert_eq!(out, "<s>[INST]A[/INST]B</s>[LAST][INST]Sys\n\nC[/INST]");
    assert!(matches!(
        render(MISTRAL_LIKE, &[("assistant", "B")], true),
        Err(ChatTemplateError::Raised { .. })
    ));
}

/// Phi-3: empty system turns skipped, EOS after the last turn when no generation prompt is asked,
/// which llama.cpp cuts off when its tokenizer adds EOS by itself.
const PHI3_LIKE: &str = "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}\
{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}\
{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}\
{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";

#[test]
fn phi3_like_empty_system_and_eos() {
    let t = ChatTemplate::new(PHI3_LIKE, "<s>", "<|endoftext|>").expect("compiles");
    let turns = msgs(&[("system", ""), ("user", "Hi")]);
    let out = t.render_at(&turns, false, july_fifth()).expect("renders");
    assert_eq!(out, "<|user|>\nHi<|end|>\n<|endoftext|>");
    let added = AddedSpecials {
        bos: true,
        eos: true,
    };
    let applied = t
        .apply_at(&turns, false, added, july_fifth())
        .expect("renders");
    assert_eq!(applied, "<|user|>\nHi<|end|>\n");
    let out = t.render_at(&turns, true, july_fifth()).expect("renders");
    assert_eq!(out, "<|user|>\nHi<|end|>\n<|assistant|>\n");
}

/// `add_generation_prompt` is undefined when off, as llama.cpp leaves it.
#[test]
fn generation_prompt_is_undefined_when_off() {
    let src = "{{ add_generation_prompt is defined }}";
    // Booleans print as Python (and llama.cpp) print them.
    assert_eq!(ok(src, &[], true), "True");
    assert_eq!(ok(src, &[], false), "False");
}

/// Messages are mappings with `role` then `content`, like the JSON llama.cpp hands its engine.
#[test]
fn messages_are_ordered_mappings() {
    let src = "{% for m in messages %}<|{{ m.role }}|>{{ m is mapping }} {{ 'content' in m }} \
{{ m.name is defined }} {% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}\n{% endfor %}";
    assert_eq!(
        ok(src, &[("user", "Hi"), ("assistant", "Yo")], false),
        "<|user|>True True False role=user;content=Hi;<|assistant|>True True False role=assistant;content=Yo;"
    );
    let src = "{% for m in messages %}<|{{ m.role }}|>{{ m | tojson }}\n{% endfor %}";
    assert_eq!(
        ok(src, &[("user", "hé \"q\"\n")], false),
        "<|user|>{\"role\": \"user\", \"content\": \"hé \\\"q\\\"\\n\"}\n"
    );
}

/// `tojson` writes JSON as llama.cpp does (Python's `json.dumps` layout, C++ float printing, no HTML
/// escapes, keys in written order), with `indent`, `separators` and `ensure_ascii`.
#[test]
fn tojson_like_llama_cpp() {
    let src =
        "{{ [1, 2.5, 0.0000125, 1234567.0, none, true, \"<a href='x'>&é</a>\", []] | tojson }}";
    assert_eq!(
        ok(src, &[], false),
        "[1, 2.5, 1.25e-05, 1.23457e+06, null, true, \"<a href='x'>&é</a>\", []]"
    );
    let src = "{{ {'k': [1, {'n': 'v'}], 'e': {}} | tojson(indent=2) }}";
    assert_eq!(
        ok(src, &[], false),
        "{\n  \"k\": [\n    1,\n    {\n      \"n\": \"v\"\n    }\n  ],\n  \"e\": {}\n}"
    );
    let src = "{{ ['é', 'x'] | tojson(ensure_ascii=true, separators=(',', ':')) }}";
    assert_eq!(ok(src, &[], false), "[\"\\u00e9\",\"x\"]");
    let src = "{{ [1] | tojson(sort_keys=true) }}";
    assert!(matches!(
        render(src, &[], false),
        Err(ChatTemplateError::Render { .. })
    ));
}

/// Odds and ends of the real templates: string slices (`out[:-1]`), `reject` + `join`, `items`,
/// `is string`, `| string`, and whitespace control.
#[test]
fn string_and_filter_constructs() {
    let src = "{%- set out = '{\"a\": 1}' %}{{- out[:-1] }}|\
{{- ['a', 'code_interpreter', 'b'] | reject('equalto', 'code_interpreter') | join(', ') }}|\
{%- for k, v in {'x': 1} | items %}{{ k }}{{ v }}{% endfor %}|\
{{- 'x' is string }}{{ 3 is string }}|{{ 3 | string + '!' }}";
    assert_eq!(ok(src, &[], false), "{\"a\": 1|a, b|x1|TrueFalse|3!");
}

/// `{% break %}` and `{% continue %}` (Command R, Kimi and Reka templates use them; llama.cpp has them).
#[test]
fn loop_controls() {
    let src = "{% for m in messages %}{% if m.role == 'assistant' %}{% continue %}{% endif %}\
{% if m.content == 'stop' %}{% break %}{% endif %}<{{ m.content }}>{% endfor %}";
    let turns = [
        ("user", "a"),
        ("assistant", "b"),
        ("user", "c"),
        ("user", "stop"),
        ("user", "d"),
    ];
    assert_eq!(ok(src, &turns, false), "<a><c>");
}

/// An earlier turn's thoughts sent back reach the template as `reasoning_content` (Qwen3's name, as
/// llama.cpp gives it) and, for gpt-oss's channel templates, as `thinking` too; a channel template's
/// call turn keeps its thoughts and loses its text (gpt-oss's template refuses both, as llama.cpp).
#[test]
fn earlier_thoughts_reach_the_template() {
    let call = shoal_model::chat::ToolCall {
        id: "c1".into(),
        name: "f".into(),
        arguments: "{}".into(),
    };
    let mut answered = ChatMessage::new("assistant", "56");
    answered.reasoning = Some("7*8".into());
    let mut calling = ChatMessage::assistant_tool_calls("Let me call.", vec![call]);
    calling.reasoning = Some("need f".into());
    let turns = vec![ChatMessage::new("user", "7*8?"), answered, calling];
    const READS: &str = "{% for m in messages %}[{{ m.role }}|{{ m.content }}|{{ m.reasoning_content }}|\
{{ m.thinking if m.thinking is defined else '-' }}]{% endfor %}";
    let plain = ChatTemplate::new(READS, "", "").expect("compiles");
    assert_eq!(
        plain
            .render_at(&turns, false, july_fifth())
            .expect("renders"),
        "[user|7*8?||-][assistant|56|7*8|-][assistant|Let me call.|need f|-]"
    );
    let channels = ChatTemplate::new(&format!("<|channel|>{READS}"), "", "").expect("compiles");
    assert!(channels.writes_channels());
    assert_eq!(
        channels
            .render_at(&turns, false, july_fifth())
            .expect("renders"),
        "<|channel|>[user|7*8?||-][assistant|56|7*8|7*8][assistant||need f|need f]"
    );
}
