//! `shoal bench --url`: the serving benchmark, like vLLM's `benchmark_serving`: bursts of C concurrent
//! streaming `/v1/completions` requests against any OpenAI-compatible server (shoal, llama-server, vLLM),
//! with time to first token, inter-token latency and aggregate throughput per concurrency level.
//!
//! Every request of a run has a distinct prompt of about 32 tokens (the first words differ, so no prefix
//! cache helps), is greedy and ignores end-of-sequence so it streams exactly `-n` tokens. A token is a
//! streamed chunk with text and no finish reason; the server's `usage.completion_tokens` is checked against
//! that count.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;

use crate::cli::BenchArgs;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

const ADJ: [&str; 16] = [
    "quiet", "bright", "ancient", "curious", "gentle", "restless", "hidden", "golden", "stubborn",
    "tiny", "clever", "silent", "wild", "patient", "lonely", "brave",
];
const NOUN: [&str; 16] = [
    "fox",
    "engineer",
    "lighthouse",
    "river",
    "painter",
    "robot",
    "garden",
    "sailor",
    "library",
    "violin",
    "mountain",
    "baker",
    "comet",
    "village",
    "teacher",
    "owl",
];
const PLACE: [&str; 8] = [
    "a northern harbor town",
    "the edge of a desert",
    "a crowded city market",
    "a small island",
    "an old mountain valley",
    "a forest near the sea",
    "a busy train station",
    "a snowy village",
];
const VERB: [&str; 8] = [
    "build bridges",
    "paint the sky",
    "count the stars",
    "grow strange plants",
    "repair old clocks",
    "write long letters",
    "sing at night",
    "map the rivers",
];

/// The `i`-th prompt of a run: about 32 tokens, its first words differ from every other's.
pub fn prompt(i: usize) -> String {
    let cap = |s: &str| {
        let mut c = s.chars();
        c.next()
            .map(|f| f.to_uppercase().chain(c).collect::<String>())
            .unwrap_or_default()
    };
    format!(
        "{} {} number {}. Write a short story about a {} {} who lives in {} and learns to {} with friends.",
        cap(ADJ[i % 16]),
        NOUN[(i / 16) % 16],
        i % 997,
        ADJ[(i % 16) * 7 % 16],
        NOUN[(i % 16) * 5 % 16],
        PLACE[i % 8],
        VERB[(i % 8) * 3 % 8]
    )
}

/// The `i`-th long prompt: sentences of the same vocabulary up to `words` words, then a request to
/// summarize them.
pub fn long_prompt(i: usize, words: usize) -> String {
    let mut out = vec![format!(
        "{} {} report {i}.",
        ADJ[i % 16],
        NOUN[(i / 16) % 16]
    )];
    let mut count = 3;
    let mut k = 0;
    while count < words {
        let s = format!(
            "The {} {} from {} wanted to {} before the {} {} arrived.",
            ADJ[(k + i) % 16],
            NOUN[(k % 16 * 3 + i) % 16],
            PLACE[k % 8],
            VERB[k % 8 * 5 % 8],
            ADJ[k % 16 * 7 % 16],
            NOUN[k % 16 * 11 % 16]
        );
        count += s.split(' ').count();
        out.push(s);
        k += 1;
    }
    out.push("Summarize the story above in one sentence.".into());
    out.join(" ")
}

/// Prompts repeat their first words after this many (16 adjectives × 16 nouns, numbers mod 997).
const PROMPT_CYCLE: usize = 256 * 997;

/// `--prompt-offset`, or a position in the prompt cycle taken from the clock (another run against the
/// same server then starts elsewhere).
fn first_prompt(args: &BenchArgs) -> usize {
    args.prompt_offset.unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        (now.as_millis() % PROMPT_CYCLE as u128) as usize
    })
}

/// Sends `body` as JSON with `req` (a POST to `url`); the response if it succeeded, else the server's
/// status and error body as the error.
pub async fn post_json(
    req: reqwest::RequestBuilder,
    url: &str,
    body: &serde_json::Value,
) -> anyhow::Result<reqwest::Response> {
    let resp = req
        .json(body)
        .send()
        .await
        .with_context(|| format!("connecting to {url}"))?;
    if !resp.status().is_success() {
        let status = resp.status();
        anyhow::bail!("{status}: {}", resp.text().await.unwrap_or_default());
    }
    Ok(resp)
}

/// Splits the complete lines off `buf` and returns the payloads of its `data:` lines (server-sent
/// events), in order; an incomplete last line stays in `buf`.
pub fn drain_sse_data(buf: &mut Vec<u8>) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = buf.drain(..=nl).collect();
        let line = String::from_utf8_lossy(&line);
        if let Some(data) = line.trim().strip_prefix("data:") {
            out.push(data.trim().to_string());
        }
    }
    out
}

/// One streamed request: when it was sent, when each token arrived, and the server's usage.
struct Timed {
    sent: Instant,
    tokens: Vec<Instant>,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

/// Counts each stream's tokens so far; wakes whoever waits for them.
#[derive(Default)]
struct Progress {
    tokens: Vec<AtomicUsize>,
    changed: tokio::sync::Notify,
}

impl Progress {
    fn new(streams: usize) -> Arc<Self> {
        Arc::new(Self {
            tokens: (0..streams).map(|_| AtomicUsize::new(0)).collect(),
            changed: tokio::sync::Notify::new(),
        })
    }

    /// Waits until every stream has at least `n` tokens.
    async fn all_reach(&self, n: usize) {
        loop {
            let woken = self.changed.notified();
            if self.tokens.iter().all(|t| t.load(Ordering::Acquire) >= n) {
                return;
            }
            woken.await;
        }
    }
}

/// The server under test and what every request to it carries.
struct Target<'a> {
    client: reqwest::Client,
    /// `.../v1/completions`.
    url: String,
    model: &'a str,
    /// Merged into every request body (`--extra`).
    extra: serde_json::Map<String, serde_json::Value>,
}

impl Target<'_> {
    /// A greedy streaming completion of exactly `max_tokens` tokens.
    async fn stream(
        &self,
        prompt: String,
        max_tokens: usize,
        progress: Option<(&Progress, usize)>,
    ) -> anyhow::Result<Timed> {
        let mut body = serde_json::json!({
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": true,
            "ignore_eos": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(obj) = body.as_object_mut() {
            obj.extend(self.extra.clone());
        }
        stream_one(&self.client, &self.url, body, progress).await
    }
}

async fn stream_one(
    client: &reqwest::Client,
    url: &str,
    body: serde_json::Value,
    progress: Option<(&Progress, usize)>,
) -> anyhow::Result<Timed> {
    let sent = Instant::now();
    let resp = post_json(client.post(url).timeout(REQUEST_TIMEOUT), url, &body).await?;
    let mut timed = Timed {
        sent,
        tokens: Vec::new(),
        prompt_tokens: None,
        completion_tokens: None,
    };
    let mut bytes = resp.bytes_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = bytes.next().await {
        buf.extend_from_slice(&chunk?);
        let now = Instant::now();
        for data in drain_sse_data(&mut buf) {
            if data == "[DONE]" {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(&data).context("bad SSE chunk")?;
            if let Some(err) = v.get("error") {
                anyhow::bail!("server error: {err}");
            }
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                timed.prompt_tokens = u["prompt_tokens"].as_u64();
                timed.completion_tokens = u["completion_tokens"].as_u64();
            }
            for c in v["choices"].as_array().into_iter().flatten() {
                if c["finish_reason"].is_null() && c["text"].is_string() {
                    timed.tokens.push(now);
                    if let Some((p, i)) = progress {
                        p.tokens[i].fetch_add(1, Ordering::AcqRel);
                        p.changed.notify_waiters();
                    }
                }
            }
        }
    }
    Ok(timed)
}

/// Figures of one burst of `c` concurrent requests.
#[derive(Debug, Clone, serde::Serialize)]
struct Burst {
    concurrency: usize,
    tokens: usize,
    /// Requests that streamed another number of tokens than asked, or than their usage says.
    short_or_mismatched: usize,
    prompt_tokens: f64,
    tok_s: f64,
    ttft_p50_ms: f64,
    ttft_p99_ms: f64,
    itl_p50_ms: f64,
    itl_p99_ms: f64,
}

async fn burst(
    target: &Target<'_>,
    n: usize,
    c: usize,
    first_prompt: usize,
) -> anyhow::Result<Burst> {
    let start = Instant::now();
    let runs =
        futures::future::join_all((0..c).map(|k| target.stream(prompt(first_prompt + k), n, None)))
            .await
            .into_iter()
            .collect::<anyhow::Result<Vec<Timed>>>()?;
    let end = runs
        .iter()
        .filter_map(|r| r.tokens.last())
        .max()
        .copied()
        .unwrap_or(start);
    let tokens: usize = runs.iter().map(|r| r.tokens.len()).sum();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut ttft: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.tokens.first().map(|t| ms(*t - r.sent)))
        .collect();
    let mut itl: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.tokens.windows(2).map(|w| ms(w[1] - w[0])))
        .collect();
    ttft.sort_by(f64::total_cmp);
    itl.sort_by(f64::total_cmp);
    let prompt_tokens: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.prompt_tokens.map(|p| p as f64))
        .collect();
    Ok(Burst {
        concurrency: c,
        tokens,
        short_or_mismatched: runs
            .iter()
            .filter(|r| {
                r.tokens.len() != n
                    || r.completion_tokens
                        .is_some_and(|u| u as usize != r.tokens.len())
            })
            .count(),
        prompt_tokens: crate::bench::median(prompt_tokens),
        tok_s: tokens as f64 / (end - start).as_secs_f64().max(1e-9),
        ttft_p50_ms: crate::bench::percentile(&ttft, 0.5),
        ttft_p99_ms: crate::bench::percentile(&ttft, 0.99),
        itl_p50_ms: crate::bench::percentile(&itl, 0.5),
        itl_p99_ms: crate::bench::percentile(&itl, 0.99),
    })
}

/// Runs the serving benchmark against `url` at every level of `levels`, `-r` times, and prints the
/// medians (a table, or JSON with every repetition).
pub fn run(args: &BenchArgs, url: &str, levels: &[usize]) -> anyhow::Result<()> {
    let extra = match &args.extra {
        Some(s) => match serde_json::from_str::<serde_json::Value>(s).context("--extra")? {
            serde_json::Value::Object(m) => m,
            _ => anyhow::bail!("--extra must be a JSON object"),
        },
        None => serde_json::Map::new(),
    };
    let target = Target {
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()?,
        url: format!("{}/v1/completions", url.trim_end_matches('/')),
        model: &args.model.model,
        extra,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let reps = args.repetitions.max(1);
    // Warm-up: one request (the server may still be bringing weights into its caches); its prompt is
    // never one a measured request uses.
    rt.block_on(burst(&target, args.gen_tokens.min(8), 1, usize::MAX >> 8))?;
    if let Some(words) = args.long_prompt {
        return rt.block_on(run_long(&target, args, url, words, reps));
    }
    let mut all: Vec<Vec<Burst>> = vec![Vec::new(); levels.len()];
    let mut next_prompt = first_prompt(args);
    rt.block_on(async {
        for _ in 0..reps {
            for (i, &c) in levels.iter().enumerate() {
                all[i].push(burst(&target, args.gen_tokens, c, next_prompt).await?);
                next_prompt += c;
            }
        }
        anyhow::Ok(())
    })?;
    let med = |bs: &[Burst], f: fn(&Burst) -> f64| crate::bench::median(bs.iter().map(f).collect());
    let single = levels
        .iter()
        .position(|&c| c == 1)
        .map(|i| med(&all[i], |b| b.tok_s));
    if args.json {
        let rows: Vec<_> = levels
            .iter()
            .zip(&all)
            .map(|(&c, bs)| {
                serde_json::json!({
                    "concurrency": c,
                    "tok_s": med(bs, |b| b.tok_s),
                    "ttft_p50_ms": med(bs, |b| b.ttft_p50_ms),
                    "ttft_p99_ms": med(bs, |b| b.ttft_p99_ms),
                    "itl_p50_ms": med(bs, |b| b.itl_p50_ms),
                    "itl_p99_ms": med(bs, |b| b.itl_p99_ms),
                    "prompt_tokens": med(bs, |b| b.prompt_tokens),
                    "repetitions": bs,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "url": url, "gen_tokens": args.gen_tokens, "results": rows })
            )?
        );
    } else {
        println!(
            "{url}: C concurrent streams of {} tokens, median of {reps}",
            args.gen_tokens
        );
        println!(
            "    C  prompt tok    tok/s  vs C=1  TTFT p50 ms  TTFT p99 ms  ITL p50 ms  ITL p99 ms  short"
        );
        for (&c, bs) in levels.iter().zip(&all) {
            let tok_s = med(bs, |b| b.tok_s);
            let ratio = single.map_or(f64::NAN, |s| tok_s / s);
            println!(
                "{c:>5}  {:>10.0}  {tok_s:>7.1}  {ratio:>5.2}x  {:>11.1}  {:>11.1}  {:>10.2}  {:>10.2}  {:>5}",
                med(bs, |b| b.prompt_tokens),
                med(bs, |b| b.ttft_p50_ms),
                med(bs, |b| b.ttft_p99_ms),
                med(bs, |b| b.itl_p50_ms),
                med(bs, |b| b.itl_p99_ms),
                bs.iter().map(|b| b.short_or_mismatched).sum::<usize>()
            );
        }
    }
    let short: usize = all.iter().flatten().map(|b| b.short_or_mismatched).sum();
    anyhow::ensure!(
        short == 0,
        "{short} requests streamed another number of tokens than asked (or than their usage says)"
    );
    Ok(())
}

/// Streams of the long-prompt scenario, and the tokens each has before the long prompt is sent.
const LONG_STREAMS: usize = 4;
const LONG_AFTER: usize = 16;

/// One run of the long-prompt scenario.
#[derive(Debug, Clone, serde::Serialize)]
struct LongRun {
    /// Whether the long prompt was sent (`false`: the streams alone).
    with_long: bool,
    itl_p50_ms: f64,
    itl_p99_ms: f64,
    itl_max_ms: f64,
    long_ttft_ms: Option<f64>,
    long_prompt_tokens: Option<u64>,
    /// Streams that did not stream exactly `-n` tokens.
    short: usize,
}

async fn long_once(
    target: &Target<'_>,
    n: usize,
    words: usize,
    with_long: bool,
    first_prompt: usize,
) -> anyhow::Result<LongRun> {
    let progress = Progress::new(LONG_STREAMS);
    let streams = futures::future::join_all(
        (0..LONG_STREAMS).map(|i| target.stream(prompt(first_prompt + i), n, Some((&progress, i)))),
    );
    let long = async {
        if !with_long {
            return anyhow::Ok(None);
        }
        tokio::time::timeout(REQUEST_TIMEOUT, progress.all_reach(LONG_AFTER))
            .await
            .context("the streams never reached their 16th token")?;
        target
            .stream(long_prompt(first_prompt, words), 4, None)
            .await
            .map(Some)
    };
    let (runs, long) = tokio::join!(streams, long);
    let runs = runs.into_iter().collect::<anyhow::Result<Vec<Timed>>>()?;
    let long = long?;
    let mut itl: Vec<f64> = runs
        .iter()
        .flat_map(|r| {
            r.tokens
                .windows(2)
                .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        })
        .collect();
    itl.sort_by(f64::total_cmp);
    Ok(LongRun {
        with_long,
        itl_p50_ms: crate::bench::percentile(&itl, 0.5),
        itl_p99_ms: crate::bench::percentile(&itl, 0.99),
        itl_max_ms: itl.last().copied().unwrap_or(f64::NAN),
        long_ttft_ms: long
            .as_ref()
            .and_then(|l| l.tokens.first().map(|t| (*t - l.sent).as_secs_f64() * 1e3)),
        long_prompt_tokens: long.as_ref().and_then(|l| l.prompt_tokens),
        short: runs.iter().filter(|r| r.tokens.len() != n).count(),
    })
}

/// The long-prompt scenario, `reps` times (streams alone, then with the long prompt); prints medians.
async fn run_long(
    target: &Target<'_>,
    args: &BenchArgs,
    url: &str,
    words: usize,
    reps: usize,
) -> anyhow::Result<()> {
    let n = args.gen_tokens;
    anyhow::ensure!(
        n >= 2 * LONG_AFTER,
        "--long-prompt needs -n of at least {} (the long prompt arrives after {LONG_AFTER} tokens)",
        2 * LONG_AFTER
    );
    let (mut idle, mut busy) = (Vec::new(), Vec::new());
    let mut next_prompt = first_prompt(args);
    for _ in 0..reps {
        for with_long in [false, true] {
            let r = long_once(target, n, words, with_long, next_prompt).await?;
            next_prompt += LONG_STREAMS + 1;
            if with_long { &mut busy } else { &mut idle }.push(r);
        }
    }
    let med =
        |rs: &[LongRun], f: fn(&LongRun) -> f64| crate::bench::median(rs.iter().map(f).collect());
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "url": url,
                "gen_tokens": n,
                "long_prompt_words": words,
                "long_prompt_tokens": med(&busy, |r| r.long_prompt_tokens.map_or(f64::NAN, |t| t as f64)),
                "long_ttft_ms": med(&busy, |r| r.long_ttft_ms.unwrap_or(f64::NAN)),
                "idle": {"itl_p50_ms": med(&idle, |r| r.itl_p50_ms), "itl_p99_ms": med(&idle, |r| r.itl_p99_ms),
                         "itl_max_ms": med(&idle, |r| r.itl_max_ms)},
                "with_long": {"itl_p50_ms": med(&busy, |r| r.itl_p50_ms), "itl_p99_ms": med(&busy, |r| r.itl_p99_ms),
                              "itl_max_ms": med(&busy, |r| r.itl_max_ms)},
                "repetitions": idle.iter().chain(&busy).collect::<Vec<_>>(),
            }))?
        );
    } else {
        println!(
            "{url}: {LONG_STREAMS} streams of {n} tokens; a {words}-word prompt ({:.0} tokens) after {LONG_AFTER} tokens each, median of {reps}",
            med(&busy, |r| r
                .long_prompt_tokens
                .map_or(f64::NAN, |t| t as f64))
        );
        println!("             ITL p50 ms  ITL p99 ms  ITL max ms  long TTFT ms");
        for (name, rs) in [("alone", &idle), ("+long", &busy)] {
            println!(
                "  {name:<9}  {:>10.2}  {:>10.2}  {:>10.2}  {:>12.0}",
                med(rs, |r| r.itl_p50_ms),
                med(rs, |r| r.itl_p99_ms),
                med(rs, |r| r.itl_max_ms),
                med(rs, |r| r.long_ttft_ms.unwrap_or(f64::NAN))
            );
        }
    }
    let short: usize = idle.iter().chain(&busy).map(|r| r.short).sum();
    anyhow::ensure!(
        short == 0,
        "{short} streams streamed another number of tokens than asked"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_differ_from_the_first_words() {
        let firsts: std::collections::HashSet<String> = (0..256)
            .map(|i| prompt(i).split(' ').take(4).collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(firsts.len(), 256);
    }

    #[test]
    fn sse_data_lines_are_split_across_chunks() {
        let mut buf = b"data: {\"a\":1}\n\nda".to_vec();
        assert_eq!(drain_sse_data(&mut buf), vec!["{\"a\":1}"]);
        buf.extend_from_slice(b"ta: [DONE]\r\n\r\n: comment\n");
        assert_eq!(drain_sse_data(&mut buf), vec!["[DONE]"]);
        assert!(buf.is_empty());
    }
}
