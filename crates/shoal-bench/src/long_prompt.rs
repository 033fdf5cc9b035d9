//! `shoal bench --url --long-prompt WORDS`: how a long prompt arriving mid-stream disturbs the streams
//! already decoding. 4 streams of `-n` tokens run alone, then again with a prompt of WORDS words sent
//! once every stream has 16 tokens; reported: the streams' inter-token latency both ways and the long
//! prompt's time to first token.

use crate::args::BenchArgs;
use crate::client::{Progress, REQUEST_TIMEOUT, Target, Timed};
use crate::error::BenchError;
use crate::prompts::{first_prompt, long_prompt, prompt};
use crate::stats::{median, percentile};

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
) -> Result<LongRun, BenchError> {
    let progress = Progress::new(LONG_STREAMS);
    let streams = futures::future::join_all(
        (0..LONG_STREAMS).map(|i| target.stream(prompt(first_prompt + i), n, Some((&progress, i)))),
    );
    let long = async {
        if !with_long {
            return Ok::<_, BenchError>(None);
        }
        tokio::time::timeout(REQUEST_TIMEOUT, progress.all_reach(LONG_AFTER))
            .await
            .map_err(BenchError::StreamsStalled)?;
        target
            .stream(long_prompt(first_prompt, words), 4, None)
            .await
            .map(Some)
    };
    let (runs, long) = tokio::join!(streams, long);
    let runs = runs
        .into_iter()
        .collect::<Result<Vec<Timed>, BenchError>>()?;
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
        itl_p50_ms: percentile(&itl, 0.5),
        itl_p99_ms: percentile(&itl, 0.99),
        itl_max_ms: itl.last().copied().unwrap_or(f64::NAN),
        long_ttft_ms: long
            .as_ref()
            .and_then(|l| l.tokens.first().map(|t| (*t - l.sent).as_secs_f64() * 1e3)),
        long_prompt_tokens: long.as_ref().and_then(|l| l.prompt_tokens),
        short: runs.iter().filter(|r| r.tokens.len() != n).count(),
    })
}

/// The long-prompt scenario, `reps` times (streams alone, then with the long prompt); prints medians.
pub(crate) async fn run(
    target: &Target<'_>,
    args: &BenchArgs,
    url: &str,
    words: usize,
    reps: usize,
) -> Result<(), BenchError> {
    let n = args.gen_tokens;
    if n < 2 * LONG_AFTER {
        return Err(BenchError::TooFewTokensForLongPrompt {
            min: 2 * LONG_AFTER,
            after: LONG_AFTER,
        });
    }
    let (mut idle, mut busy) = (Vec::new(), Vec::new());
    let mut next_prompt = first_prompt(args.prompt_offset);
    for _ in 0..reps {
        for with_long in [false, true] {
            let r = long_once(target, n, words, with_long, next_prompt).await?;
            next_prompt += LONG_STREAMS + 1;
            if with_long { &mut busy } else { &mut idle }.push(r);
        }
    }
    let med = |rs: &[LongRun], f: fn(&LongRun) -> f64| median(rs.iter().map(f).collect());
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
    if short != 0 {
        return Err(BenchError::ShortStreams { count: short });
    }
    Ok(())
}
