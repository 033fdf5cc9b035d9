//! Renders conversations with a chat template file, for `scripts/reference/chat_templates_check.py`.
//!
//! Usage: `render_chat TEMPLATE CASES_JSON [--bos TEXT] [--eos TEXT] [--add-bos] [--add-eos]`
//!
//! `TEMPLATE` is a Jinja chat template file; `CASES_JSON` a file holding a JSON array of cases
//! `{"messages": [{"role": .., "content": ..}, ..], "add_generation_prompt": bool, "tools": [..]}`
//! (messages as [`ChatMessage`] serializes: `tool_calls` `[{"id", "name", "arguments"}]`, `tool_call_id`,
//! `name`; `tools` optional, OpenAI function definitions). `--bos`/`--eos` are
//! the token texts the template sees as `bos_token`/`eos_token`; `--add-bos`/`--add-eos` say that the
//! tokenizer adds them (so llama.cpp cuts them off the rendered text: [`ChatTemplate::apply`]).
//! Prints one JSON array to stdout with, per case, `{"prompt": TEXT}` or `{"error": MESSAGE}`.

use std::process::ExitCode;

use serde::Deserialize;
use shoal_model::chat::{AddedSpecials, ChatMessage, ChatTemplate};

#[derive(Deserialize)]
struct Case {
    messages: Vec<ChatMessage>,
    #[serde(default = "yes")]
    add_generation_prompt: bool,
    #[serde(default)]
    tools: Vec<serde_json::Value>,
}

fn yes() -> bool {
    true
}

struct Args {
    template: String,
    cases: String,
    bos: String,
    eos: String,
    added: AddedSpecials,
}

fn parse_args() -> Result<Args, String> {
    let mut positional = Vec::new();
    let (mut bos, mut eos) = (String::new(), String::new());
    let mut added = AddedSpecials::default();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--bos" => bos = it.next().ok_or("--bos needs a value")?,
            "--eos" => eos = it.next().ok_or("--eos needs a value")?,
            "--add-bos" => added.bos = true,
            "--add-eos" => added.eos = true,
            _ if arg.starts_with("--") => return Err(format!("unknown option {arg}")),
            _ => positional.push(arg),
        }
    }
    let [template, cases]: [String; 2] = positional.try_into().map_err(
        |_| "usage: render_chat TEMPLATE CASES_JSON [--bos T] [--eos T] [--add-bos] [--add-eos]",
    )?;
    Ok(Args {
        template,
        cases,
        bos,
        eos,
        added,
    })
}

fn run() -> Result<String, String> {
    let args = parse_args()?;
    let source = std::fs::read_to_string(&args.template)
        .map_err(|e| format!("read {}: {e}", args.template))?;
    let cases =
        std::fs::read_to_string(&args.cases).map_err(|e| format!("read {}: {e}", args.cases))?;
    let cases: Vec<Case> =
        serde_json::from_str(&cases).map_err(|e| format!("parse {}: {e}", args.cases))?;
    let template = ChatTemplate::new(&source, &args.bos, &args.eos).map_err(|e| e.to_string())?;
    let results: Vec<serde_json::Value> = cases
        .iter()
        .map(|case| {
            match template.apply_tools(
                &case.messages,
                &case.tools,
                case.add_generation_prompt,
                args.added,
            ) {
                Ok(prompt) => serde_json::json!({ "prompt": prompt }),
                Err(e) => serde_json::json!({ "error": e.to_string() }),
            }
        })
        .collect();
    serde_json::to_string(&results).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    match run() {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("render_chat: {e}");
            ExitCode::FAILURE
        }
    }
}
