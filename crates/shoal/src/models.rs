//! `shoal pull` / `shoal models` / `shoal rm`, and [`resolve_model`] (the model argument of serve, chat and
//! bench → id + gguf path) — all through `shoal_store::Store::pull`. A model already complete here is
//! found without the network; a download shows an `indicatif` bar (bytes, speed, ETA) on a terminal, plain
//! lines otherwise, and Ctrl-C cancels it cleanly (the partial file stays; the next pull resumes it).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use shoal_store::{
    CancelToken, Phase, Progress, ProgressFn, PullOptions, Pulled, State, Store, StoreError,
};

use crate::cli::{ModelArgs, ModelsArgs, PullArgs, RmArgs, models_dir_or_default};

/// Exit status of a pull cancelled with Ctrl-C (128 + SIGINT, as shells report it).
const CANCELLED_EXIT: i32 = 130;

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

/// Renders progress: a bar on a terminal, else a line per phase and at most one every 2 s.
fn renderer() -> ProgressFn {
    if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(0);
        let style = indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        return Arc::new(move |p: &Progress| {
            bar.set_length(p.total);
            bar.set_position(p.done);
            match &p.phase {
                Phase::Done => bar.finish_and_clear(),
                Phase::Pip { part, parts } => {
                    bar.set_message(format!("{} (pip, part {part} of {parts})", p.file))
                }
                other => bar.set_message(format!("{} ({})", p.file, phase_name(other))),
            }
        });
    }
    let last: Mutex<(Option<Instant>, String)> = Mutex::new((None, String::new()));
    Arc::new(move |p: &Progress| {
        let Ok(mut last) = last.lock() else { return };
        let phase = match &p.phase {
            Phase::Pip { part, parts } => format!("pip part {part} of {parts}"),
            other => phase_name(other).to_string(),
        };
        let due = last.0.is_none_or(|t| t.elapsed() >= Duration::from_secs(2));
        if phase == last.1 && !due {
            return;
        }
        *last = (Some(Instant::now()), phase.clone());
        if p.total == 0 {
            eprintln!("shoal: {}: {phase}", p.file);
            return;
        }
        let pct = if p.total > 0 {
            p.done as f64 * 100.0 / p.total as f64
        } else {
            0.0
        };
        let eta = p
            .eta_s
            .map(|s| format!(", ETA {s:.0} s"))
            .unwrap_or_default();
        eprintln!(
            "shoal: {}: {phase} {} of {} ({pct:.0}%), {}/s{eta}",
            p.file,
            mib(p.done),
            mib(p.total),
            mib(p.bytes_per_s as u64)
        );
    })
}

fn phase_name(p: &Phase) -> &'static str {
    match p {
        Phase::Resolving => "resolving",
        Phase::Rehashing => "checking the bytes already here",
        Phase::Downloading => "downloading",
        Phase::Pip { .. } => "pip",
        Phase::Verifying => "verifying",
        Phase::Done => "done",
    }
}

/// `name` when it is complete here (a path, the models dir, the hub cache), found without the network;
/// `None` when it would have to be downloaded.
pub fn pull_local(store: &Store, name: &str) -> anyhow::Result<Option<Pulled>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let local = PullOptions {
        offline: true,
        ..PullOptions::default()
    };
    match rt.block_on(store.pull_named(name, &local)) {
        Ok(p) => Ok(Some(p)),
        Err(StoreError::Offline { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Pulls `name` into `store`: without the network when it is complete here, else downloading with
/// progress and Ctrl-C cancellation. A cancelled pull exits the process with status 130.
fn pull_with_progress(store: &Store, name: &str, offline: bool) -> anyhow::Result<Pulled> {
    if let Some(p) = pull_local(store, name)? {
        return Ok(p);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let cancel = CancelToken::new();
    let opts = PullOptions {
        progress: renderer(),
        cancel: cancel.clone(),
        offline,
    };
    let pulling = Arc::new(AtomicBool::new(true));
    watch_ctrl_c(cancel, pulling.clone())?;
    let result = rt.block_on(store.pull_named(name, &opts));
    pulling.store(false, Ordering::SeqCst);
    match result {
        Ok(p) => Ok(p),
        Err(e @ StoreError::Cancelled { .. }) => {
            eprintln!("shoal: {e}");
            eprintln!("shoal: run `shoal pull {name}` again to resume");
            std::process::exit(CANCELLED_EXIT);
        }
        Err(e) => Err(e.into()),
    }
}

/// Ctrl-C while `pulling` cancels the download (the pull returns at its next read, partial kept). Once a
/// process listens for SIGINT it keeps the signal from killing it, so the watcher lives on: a Ctrl-C after
/// the pull ends the process as the default action would have.
fn watch_ctrl_c(cancel: CancelToken, pulling: Arc<AtomicBool>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal watcher")?;
    std::thread::Builder::new()
        .name("shoal-ctrl-c".into())
        .spawn(move || {
            rt.block_on(async {
                while tokio::signal::ctrl_c().await.is_ok() {
                    if pulling.load(Ordering::SeqCst) {
                        cancel.cancel();
                    } else {
                        std::process::exit(CANCELLED_EXIT);
                    }
                }
            })
        })
        .context("starting the signal watcher")?;
    Ok(())
}

/// Resolves the model argument to (id, path), fetching the model when it is missing.
pub fn resolve_model(args: &ModelArgs) -> anyhow::Result<(String, PathBuf)> {
    let store = Store::new(args.models_dir());
    let p = pull_with_progress(&store, &args.model, args.offline)
        .with_context(|| format!("getting model '{}'", shown(&args.model)))?;
    Ok((p.id, p.path))
}

/// A model name as an error shows it: at most 80 characters (a hostile name may be kilobytes).
pub(crate) use shoal_api::error::shown_name as shown;

/// `shoal pull MODEL`: prints `ID: PATH` on stdout.
pub fn pull(args: &PullArgs) -> anyhow::Result<()> {
    let m = args.resolved();
    let (id, path) = resolve_model(&m)?;
    println!("{id}: {}", path.display());
    Ok(())
}

/// `shoal models`: one line per folder of the models directory.
pub fn models(args: &ModelsArgs) -> anyhow::Result<()> {
    let store = Store::new(models_dir_or_default(&args.models_dir));
    let list = store.list();
    if list.is_empty() {
        eprintln!("shoal: no models in {}", store.root().display());
    }
    for e in list {
        let state = match e.state {
            State::Complete => "complete".to_string(),
            State::Partial { have } if e.size > 0 => format!(
                "partial {} of {} ({:.0}%)",
                mib(have),
                mib(e.size),
                have as f64 * 100.0 / e.size as f64
            ),
            State::Partial { have } => format!("partial {}", mib(have)),
        };
        println!(
            "{:<48} {:>12}  {:<7}  {state}",
            e.id,
            mib(e.size),
            e.source.as_str()
        );
    }
    Ok(())
}

/// `shoal rm MODEL`: a model id (as `shoal models` shows it), never a path. Deletes only the files shoal
/// wrote in the model's folder, then the folder when it is empty; says what it left.
pub fn rm(args: &RmArgs) -> anyhow::Result<()> {
    let store = Store::new(models_dir_or_default(&args.models_dir));
    let done = store
        .remove(&args.id, args.purge)
        .with_context(|| format!("removing '{}'", shown(&args.id)))?;
    // A folder that went stands for the files in it.
    let gone = |p: &PathBuf| {
        p.parent()
            .is_some_and(|d| done.removed.iter().any(|r| r == d))
    };
    for p in done.removed.iter().filter(|p| !gone(p)) {
        println!("removed {}", p.display());
    }
    if !done.kept.is_empty() {
        let names: Vec<String> = done.kept.iter().map(|p| p.display().to_string()).collect();
        eprintln!(
            "shoal: kept the folder: it holds files shoal did not write: {}",
            names.join(", ")
        );
    }
    Ok(())
}
