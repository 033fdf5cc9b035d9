//! Golden tests for `shoal_model::chat::ChatTemplate` against llama.cpp's rendering of SmolLM2's own
//! chat template (`shared/golden/smollm2-135m-q4_1.chat.json`), and of the token count of the
//! rendered prompt (which settles whether a BOS is added: it is not).
//!
//! The model is found through `SHOAL_TEST_MODEL` (else the default path under `$HOME`), the golden
//! files through `SHOAL_GOLDEN_DIR` (else `shared/golden` next to the repository). Either missing is a
//! failure with instructions, never a silent skip.

use std::sync::OnceLock;

use candle_core::quantized::gguf_file::Content;
use shoal_model::chat::{ChatMessage, ChatTemplate, ChatTemplateError};
use shoal_model::tokenizer::Tokenizer;
use shoal_testkit::fixtures::{golden_dir, model_path};

fn content() -> &'static Content {
    static CONTENT: OnceLock<Content> = OnceLock::new();
    CONTENT.get_or_init(|| {
        let mut file = std::fs::File::open(model_path()).expect("open model");
        Content::read(&mut file).expect("read GGUF header")
    })
}

struct Case {
    messages: Vec<ChatMessage>,
    rendered_prompt: String,
    prompt_tokens: usize,
}

fn cases() -> Vec<Case> {
    let path = golden_dir().join("smollm2-135m-q4_1.chat.json");
    let text = std::fs::read_to_string(&path).expect("read chat golden");
    let json: serde_json::Value = serde_json::from_str(&text).expect("parse chat golden");
    let cases: Vec<Case> = json
        .as_array()
        .expect("top-level array")
        .iter()
        .map(|c| Case {
            messages: serde_json::from_value(c["messages"].clone()).expect("messages"),
            rendered_prompt: c["rendered_prompt"]
                .as_str()
                .expect("rendered_prompt")
                .to_owned(),
            prompt_tokens: c["usage"]["prompt_tokens"]
                .as_u64()
                .expect("usage.prompt_tokens") as usize,
        })
        .collect();
    assert!(cases.len() >= 3, "expected at least 3 golden chats");
    cases
}

#[test]
fn golden_chats_render_exactly() {
    let template = ChatTemplate::from_gguf(content()).expect("template from GGUF");
    assert_eq!(template.bos_token(), "<|im_start|>");
    assert_eq!(template.eos_token(), "<|im_end|>");
    for case in cases() {
        let rendered = template.render(&case.messages, true).expect("render");
        assert_eq!(
            rendered, case.rendered_prompt,
            "messages {:?}",
            case.messages
        );
    }
}

#[test]
fn generation_prompt_is_optional() {
    let template = ChatTemplate::from_gguf(content()).expect("template from GGUF");
    let case = &cases()[0];
    let without = template.render(&case.messages, false).expect("render");
    assert_eq!(
        format!("{without}<|im_start|>assistant\n"),
        case.rendered_prompt
    );
}

/// llama.cpp counted `usage.prompt_tokens` for the rendered prompt. SmolLM2's GGUF says
/// `add_bos_token = false`, and the count equals the special-parsed tokenization *without* BOS
/// (BOS would be `<|im_start|>`, id 1, making every count one higher).
#[test]
fn golden_chat_prompt_token_counts_have_no_bos() {
    let tok = Tokenizer::from_gguf(content()).expect("tokenizer from GGUF");
    let template = ChatTemplate::from_gguf(content()).expect("template from GGUF");
    assert!(!tok.add_bos());
    for case in cases() {
        let rendered = template.render(&case.messages, true).expect("render");
        let ids = tok.encode(&rendered, true);
        assert_eq!(ids.len(), case.prompt_tokens, "{rendered:?}");
        assert_eq!(tok.encode_prompt(&rendered), ids);
        // Every `<|im_start|>` / `<|im_end|>` became a single special token.
        let starts = rendered.matches("<|im_start|>").count();
        let ends = rendered.matches("<|im_end|>").count();
        assert_eq!(ids.iter().filter(|&&id| id == 1).count(), starts);
        assert_eq!(ids.iter().filter(|&&id| id == 2).count(), ends);
        assert_eq!(ids.first(), Some(&1));
        assert_eq!(tok.decode(&ids), rendered);
        // Without special parsing the markers are plain text and the count is much larger.
        assert!(tok.encode(&rendered, false).len() > ids.len() + 4 * starts);
    }
}

#[test]
fn template_errors_are_errors_not_panics() {
    let raising =
        "{% if messages | length == 0 %}{{ raise_exception('no messages') }}{% endif %}ok";
    let t = ChatTemplate::new(raising, "", "").expect("compiles");
    match t.render(&[], true) {
        Err(ChatTemplateError::Raised { message }) => assert_eq!(message, "no messages"),
        other => panic!("expected a raised error, got {other:?}"),
    }
    assert_eq!(
        t.render(&[ChatMessage::new("user", "x")], true)
            .expect("renders"),
        "ok"
    );

    // Runtime error other than raise_exception (calling an undefined function).
    let broken = ChatTemplate::new("{{ no_such_function() }}", "", "").expect("compiles");
    assert!(matches!(
        broken.render(&[], true),
        Err(ChatTemplateError::Render { .. })
    ));

    assert!(matches!(
        ChatTemplate::new("{% if %}", "", ""),
        Err(ChatTemplateError::Compile { .. })
    ));
}

#[test]
fn hf_style_template_with_python_methods() {
    // The shape of many HF templates: loop over messages, `.strip()`, `loop.last`, `bos_token`.
    let src = "{{ bos_token }}{% for message in messages %}\n\
        {% if message['role'] == 'user' %}\n\
        [INST] {{ message['content'].strip() }} [/INST]\n\
        {% else %}\n\
        {{ message['content'].strip() }}{{ eos_token }}\n\
        {% endif %}\n\
        {% endfor %}";
    let t = ChatTemplate::new(src, "<s>", "</s>").expect("compiles");
    let out = t
        .render(
            &[
                ChatMessage::new("user", "  Hi  "),
                ChatMessage::new("assistant", " Hello "),
            ],
            false,
        )
        .expect("renders");
    assert_eq!(out, "<s>[INST] Hi [/INST]\nHello</s>\n");
}
