//! Log set-up: which lines are written ([`filter_spec`]: `--log`, else `RUST_LOG`, else the older
//! `SHOAL_LOG`, else `info`; per-module directives such as `shoal_cluster=debug,shoal_engine=info`), in
//! which shape ([`LogFormat`]: text, or one JSON object per line), and whether with colours ([`use_ansi`]:
//! only on a terminal, never with `NO_COLOR`). Everything goes to stderr; a request's lines carry its
//! span `request{id=…}` (set by `shoal-api`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How each log line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines: time, level, spans with their fields, target, message.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields.message`, `target`, `span`, `spans`).
    Json,
}

/// A filter that cannot be parsed.
#[derive(Debug, thiserror::Error)]
#[error(
    "the log filter '{spec}' (from {origin}) is not valid: {reason}. Write a level (error, warn, info, debug, \
     trace) or per-module levels such as 'info,shoal_cluster=debug'"
)]
pub struct BadFilter {
    pub spec: String,
    pub origin: &'static str,
    pub reason: String,
}

/// The filter to use and where it came from: `--log`, else `RUST_LOG`, else `SHOAL_LOG` (the older name),
/// else `info`. An empty variable counts as unset.
pub fn filter_spec(
    flag: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> (String, &'static str) {
    if let Some(f) = flag {
        return (f.to_string(), "--log");
    }
    for name in ["RUST_LOG", "SHOAL_LOG"] {
        if let Some(v) = env(name).filter(|v| !v.trim().is_empty()) {
            return (v, name);
        }
    }
    ("info".to_string(), "the default")
}

/// Parses a filter, every directive strictly (a typo is an error, not a silently ignored directive).
pub fn parse_filter(spec: &str, origin: &'static str) -> Result<EnvFilter, BadFilter> {
    EnvFilter::builder().parse(spec).map_err(|e| BadFilter {
        spec: spec.to_string(),
        origin,
        reason: e.to_string(),
    })
}

/// Colours only when stderr is a terminal and `NO_COLOR` is unset or empty (no-color.org).
pub fn use_ansi(stderr_is_terminal: bool, no_color: Option<&str>) -> bool {
    stderr_is_terminal && no_color.is_none_or(str::is_empty)
}

/// Installs the global subscriber writing to stderr.
pub fn init(flag: Option<&str>, format: LogFormat) -> Result<(), BadFilter> {
    let env = |name: &str| std::env::var(name).ok();
    let (spec, origin) = filter_spec(flag, env);
    let filter = parse_filter(&spec, origin)?;
    let no_color = std::env::var("NO_COLOR").ok();
    let ansi = use_ansi(std::io::stderr().is_terminal(), no_color.as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_flag_wins_then_rust_log_then_shoal_log_then_info() {
        let both = env_of(&[("RUST_LOG", "warn"), ("SHOAL_LOG", "debug")]);
        assert_eq!(filter_spec(Some("error"), &both), ("error".into(), "--log"));
        assert_eq!(filter_spec(None, &both), ("warn".into(), "RUST_LOG"));
        let old = env_of(&[("RUST_LOG", " "), ("SHOAL_LOG", "shoal_engine=debug")]);
        assert_eq!(
            filter_spec(None, &old),
            ("shoal_engine=debug".into(), "SHOAL_LOG")
        );
        assert_eq!(
            filter_spec(None, env_of(&[])),
            ("info".into(), "the default")
        );
    }

    #[test]
    fn per_module_filters_parse_and_a_bad_one_is_a_sentence() {
        assert!(parse_filter("shoal_cluster=debug,shoal_engine=info", "--log").is_ok());
        assert!(parse_filter("info,shoal_api=trace", "RUST_LOG").is_ok());
        let e = parse_filter("shoal_cluster=loud", "--log").expect_err("bad level");
        let text = e.to_string();
        assert!(
            text.starts_with("the log filter 'shoal_cluster=loud' (from --log) is not valid: "),
            "{text}"
        );
        assert!(
            text.ends_with("Write a level (error, warn, info, debug, trace) or per-module levels such as 'info,shoal_cluster=debug'"),
            "{text}"
        );
    }

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        assert!(use_ansi(true, None));
        assert!(use_ansi(true, Some("")));
        assert!(!use_ansi(true, Some("1")));
        assert!(!use_ansi(false, None));
    }
}
