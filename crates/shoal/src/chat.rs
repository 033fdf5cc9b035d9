//! `shoal chat`: one user message, the answer streamed to the terminal.

use std::io::Write;

use shoal_bench::sse::{SseReader, parse_chunk, post_json};
use shoal_engine::{ChatMessage, Event, GenerateRequest, Prompt, SamplingParams};

use crate::cli::ChatArgs;

fn messages(args: &ChatArgs) -> Vec<ChatMessage> {
    let mut m = Vec::new();
    if let Some(system) = &args.system {
        m.push(ChatMessage::new("system", system.clone()));
    }
    m.push(ChatMessage::new("user", args.prompt.clone()));
    m
}

pub fn run(args: ChatArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match args.url.clone() {
        Some(url) => rt.block_on(remote(&args, &url)),
        None => {
            // Outside the runtime: fetching the model runs (and may cancel) its own.
            let (id, path) = crate::resolve_model(&args.model)?;
            rt.block_on(local(&args, id, path))
        }
    }
}

async fn local(args: &ChatArgs, id: String, path: std::path::PathBuf) -> anyhow::Result<()> {
    let mut config = args.engine.config()?;
    config.device = crate::gpus::resolve_for_model(args.engine.device, &path, config.threads);
    let engine = shoal_engine::engine::spawn_from_gguf(&path, &id, config)?;
    let prompt = engine.render_chat(&messages(args))?;
    let sampling = SamplingParams {
        temperature: args.temperature,
        seed: args.seed,
        ..Default::default()
    }
    .validate()?;
    let mut stream = engine.submit(GenerateRequest {
        model: id,
        prompt: Prompt::Text(prompt),
        sampling,
        max_tokens: Some(shoal_engine::request::max_tokens(args.max_tokens)?),
        stop: Vec::new(),
        // render_chat cut the template's own BOS where the tokenizer adds one.
        add_bos: true,
        ignore_eos: false,
        timeout: None,
        logits_processor: None,
        speculative: None,
    })?;
    let mut out = std::io::stdout().lock();
    while let Some(event) = stream.next().await {
        match event {
            Event::Token { text, .. } => {
                out.write_all(text.as_bytes())?;
                out.flush()?;
            }
            Event::Done { .. } => break,
            Event::Error(e) => anyhow::bail!("generation failed: {e}"),
        }
    }
    writeln!(out)?;
    Ok(())
}

async fn remote(args: &ChatArgs, url: &str) -> anyhow::Result<()> {
    let body = serde_json::json!({
        "model": args.model.model,
        "messages": messages(args),
        "stream": true,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
    });
    let endpoint = format!("{}/v1/chat/completions", url.trim_end_matches('/'));
    let req = reqwest::Client::new().post(&endpoint);
    let mut events = SseReader::new(post_json(req, &endpoint, &body).await?);
    let mut out = std::io::stdout().lock();
    while let Some(payloads) = events.next_chunk().await? {
        for data in payloads {
            if data == "[DONE]" {
                writeln!(out)?;
                return Ok(());
            }
            if let Some(t) = parse_chunk(&data)?
                .pointer("/choices/0/delta/content")
                .and_then(|t| t.as_str())
            {
                out.write_all(t.as_bytes())?;
                out.flush()?;
            }
        }
    }
    writeln!(out)?;
    Ok(())
}
