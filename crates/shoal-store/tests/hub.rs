//! Hub downloads against `scripts/fakehub` over real HTTP on 127.0.0.1, with files the tests write:
//! quantization tags, the hub cache written exactly as huggingface_hub lays it out (and reused with the hub
//! down), the token, etag mismatch, offline mode, the free-space check, cancel + resume, errors, removal.

mod common;

use std::fs;
use std::sync::{Arc, Mutex};

use common::{Dirs, FakeHub, bytes, rt, sha256_hex};
use shoal_store::{
    CancelToken, HubRef, ModelRef, Phase, Progress, PullOptions, Source, State, StoreError,
};

const REPO: &str = "org/Tiny-GGUF";

/// A repository with two quantizations and two small files.
fn tiny_repo(hub: &FakeHub) -> (Vec<u8>, Vec<u8>) {
    let q4 = bytes(2_000_000, 1);
    let q8 = bytes(1_000_000, 2);
    hub.add(REPO, "Tiny-Q4_K_M.gguf", &q4);
    hub.add(REPO, "Tiny-Q8_0.gguf", &q8);
    hub.add(REPO, "README.md", b"# tiny\n");
    hub.add(REPO, "config.json", b"{}\n");
    (q4, q8)
}

#[test]
fn a_quant_tag_downloads_its_file_into_the_hub_cache_layout() {
    let hub = FakeHub::start(&[]);
    let (q4, _) = tiny_repo(&hub);
    let dirs = Dirs::new();
    let store = dirs.store(&hub.url);
    let rt = rt();
    let pulled = rt
        .block_on(store.pull_named("org/Tiny-GGUF:q4_k_m", &PullOptions::default()))
        .expect("pull");
    assert_eq!(pulled.id, "org/Tiny-GGUF:Q4_K_M");
    assert!(pulled.downloaded);
    assert_eq!(fs::read(&pulled.path).unwrap(), q4);

    // The cache, as huggingface_hub writes it.
    let listing = rt
        .block_on(store.hub().unwrap().list(REPO, "main"))
        .unwrap();
    let repo_dir = dirs.cache.path().join("models--org--Tiny-GGUF");
    let sha = sha256_hex(&q4);
    assert_eq!(fs::read(repo_dir.join("blobs").join(&sha)).unwrap(), q4);
    let snap = repo_dir
        .join("snapshots")
        .join(&listing.commit)
        .join("Tiny-Q4_K_M.gguf");
    assert_eq!(
        fs::read_link(&snap).unwrap(),
        std::path::PathBuf::from(format!("../../blobs/{sha}"))
    );
    assert_eq!(
        fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        listing.commit
    );
    let blobs: Vec<String> = fs::read_dir(repo_dir.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        blobs,
        vec![sha.clone()],
        "only the wanted blob, no .incomplete"
    );
    // hf-hub's own reader finds it.
    let cache = hf_hub::Cache::new(dirs.cache.path().to_path_buf());
    assert_eq!(
        cache.model(REPO.into()).get("Tiny-Q4_K_M.gguf"),
        Some(snap.clone())
    );

    // The models-dir folder: model.json and a link to the snapshot file.
    let dir = store.model_dir("org/Tiny-GGUF:Q4_K_M").unwrap();
    assert_eq!(dir.file_name().unwrap(), "org--Tiny-GGUF--Q4_K_M");
    let info = store.info(&dir).unwrap().expect("model.json");
    assert_eq!(info.source, Source::Hub);
    assert_eq!(info.repo.as_deref(), Some(REPO));
    assert_eq!(info.commit.as_deref(), Some(listing.commit.as_str()));
    assert_eq!(info.file, "Tiny-Q4_K_M.gguf");
    assert_eq!(info.sha256.as_deref(), Some(sha.as_str()));
    assert_eq!(info.size, q4.len() as u64);
    assert_eq!(fs::read_link(dir.join("Tiny-Q4_K_M.gguf")).unwrap(), snap);
    let list = store.list();
    assert_eq!(list.len(), 1);
    assert_eq!(
        (list[0].id.as_str(), list[0].state, list[0].size),
        ("org/Tiny-GGUF:Q4_K_M", State::Complete, q4.len() as u64)
    );
    assert_eq!(
        store.model_file("org/Tiny-GGUF:Q4_K_M").unwrap(),
        pulled.path
    );

    // The content came in one plain GET, and a second pull asks nothing.
    assert_eq!(hub.wait_content_gets(1).len(), 1);
    let n = hub.requests().len();
    assert_eq!(hub.content_gets()[0].range, None);
    let again = rt
        .block_on(store.pull_named("org/Tiny-GGUF:Q4_K_M", &PullOptions::default()))
        .unwrap();
    assert!(!again.downloaded);
    assert_eq!(hub.requests().len(), n);
}

#[test]
fn a_file_in_the_hub_cache_is_reused_with_the_hub_down() {
    // Laid out by hand as huggingface_hub does (another tool's download), nothing listening at the endpoint.
    let dirs = Dirs::new();
    let content = bytes(300_000, 7);
    let sha = sha256_hex(&content);
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo_dir = dirs.cache.path().join("models--bartowski--Some-Model-GGUF");
    fs::create_dir_all(repo_dir.join("blobs")).unwrap();
    fs::create_dir_all(repo_dir.join("snapshots").join(commit)).unwrap();
    fs::create_dir_all(repo_dir.join("refs")).unwrap();
    fs::write(repo_dir.join("blobs").join(&sha), &content).unwrap();
    std::os::unix::fs::symlink(
        format!("../../blobs/{sha}"),
        repo_dir
            .join("snapshots")
            .join(commit)
            .join("Some-Model-Q4_K_M.gguf"),
    )
    .unwrap();
    fs::write(repo_dir.join("refs/main"), commit).unwrap();

    let store = dirs.store("http://127.0.0.1:9");
    let rt = rt();
    for name in [
        "bartowski/Some-Model-GGUF:Q4_K_M",
        "bartowski/Some-Model-GGUF",
        "bartowski/Some-Model-GGUF/Some-Model-Q4_K_M.gguf",
    ] {
        let p = rt
            .block_on(store.pull_named(name, &PullOptions::default()))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!p.downloaded);
        assert_eq!(fs::read(&p.path).unwrap(), content, "{name}");
        let info = store
            .info(&store.model_dir(name).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(info.commit.as_deref(), Some(commit));
        assert_eq!(info.sha256.as_deref(), Some(sha.as_str()));
    }
    // A hub id resolves from the cache alone even without a models-dir folder.
    let fresh_models = tempfile::tempdir().unwrap();
    let other =
        shoal_store::Store::new(fresh_models.path()).with_hub(dirs.config("http://127.0.0.1:9"));
    assert_eq!(
        fs::read(
            other
                .model_file("bartowski/Some-Model-GGUF:Q4_K_M")
                .unwrap()
        )
        .unwrap(),
        content
    );

    // Downloaded once from fakehub, then the hub goes away: a fresh models dir still gets it.
    let mut hub = FakeHub::start(&[]);
    let (q4, _) = tiny_repo(&hub);
    let first = dirs.store(&hub.url);
    rt.block_on(first.pull_named("org/Tiny-GGUF:Q4_K_M", &PullOptions::default()))
        .unwrap();
    let url = hub.url.clone();
    hub.stop();
    let second = shoal_store::Store::new(fresh_models.path()).with_hub(dirs.config(&url));
    let p = rt
        .block_on(second.pull_named("org/Tiny-GGUF:Q4_K_M", &PullOptions::default()))
        .unwrap();
    assert_eq!(fs::read(p.path).unwrap(), q4);
}

#[test]
fn the_token_is_sent_and_required() {
    let hub = FakeHub::start(&["--token", "s3cret"]);
    tiny_repo(&hub);
    let dirs = Dirs::new();
    let rt = rt();
    let e = rt
        .block_on(
            dirs.store(&hub.url)
                .pull_named("org/Tiny-GGUF:Q8_0", &PullOptions::default()),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Unauthorized {
                status: 401,
                token_sent: false,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("HF_TOKEN"), "{e}");
    let mut wrong = dirs.config(&hub.url);
    wrong.token = Some("nope".into());
    let store = shoal_store::Store::new(dirs.models.path()).with_hub(wrong);
    let e = rt
        .block_on(store.pull_named("org/Tiny-GGUF:Q8_0", &PullOptions::default()))
        .unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Unauthorized {
                token_sent: true,
                ..
            }
        ),
        "{e}"
    );

    let mut cfg = dirs.config(&hub.url);
    cfg.token = Some("s3cret".into());
    let store = shoal_store::Store::new(dirs.models.path()).with_hub(cfg);
    let before = hub.requests().len();
    rt.block_on(store.pull_named("org/Tiny-GGUF:Q8_0", &PullOptions::default()))
        .expect("with the token");
    let hub_requests: Vec<_> = hub.requests()[before..]
        .iter()
        .filter(|r| !r.path.starts_with("/cdn/"))
        .cloned()
        .collect();
    assert!(hub_requests.len() >= 2, "{hub_requests:?}");
    assert!(
        hub_requests.iter().all(|r| r.auth && r.status < 400),
        "{hub_requests:?}"
    );
}

#[test]
fn an_etag_mismatch_is_an_error_and_leaves_nothing_complete() {
    let hub = FakeHub::start(&["--bad-etag", "Tiny-Q4_K_M.gguf"]);
    tiny_repo(&hub);
    let dirs = Dirs::new();
    let store = dirs.store(&hub.url);
    let e = rt()
        .block_on(store.pull_named("org/Tiny-GGUF:Q4_K_M", &PullOptions::default()))
        .unwrap_err();
    assert!(matches!(e, StoreError::EtagMismatch { .. }), "{e}");
    let blobs = dirs.cache.path().join("models--org--Tiny-GGUF/blobs");
    assert_eq!(
        fs::read_dir(&blobs).unwrap().count(),
        0,
        "no blob, no .incomplete"
    );
    assert!(
        !dirs
            .cache
            .path()
            .join("models--org--Tiny-GGUF/snapshots")
            .exists()
    );
    assert!(!store.is_present("org/Tiny-GGUF:Q4_K_M"));
    assert!(store.model_file("org/Tiny-GGUF:Q4_K_M").is_err());
    assert!(store.list().iter().all(|e| e.state != State::Complete));
}

#[test]
fn offline_uses_complete_files_only_and_names_what_is_missing() {
    let hub = FakeHub::start(&[]);
    let (_, q8) = tiny_repo(&hub);
    let dirs = Dirs::new();
    let rt = rt();
    let offline = PullOptions {
        offline: true,
        ..PullOptions::default()
    };
    let e = rt
        .block_on(
            dirs.store(&hub.url)
                .pull_named("org/Tiny-GGUF:Q8_0", &offline),
        )
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, StoreError::Offline { .. }), "{msg}");
    assert!(msg.contains("org/Tiny-GGUF:Q8_0"), "{msg}");
    assert!(
        msg.contains(&dirs.cache.path().display().to_string()),
        "{msg}"
    );
    assert!(
        hub.requests().is_empty(),
        "offline asked the hub: {:?}",
        hub.requests()
    );

    // A partial blob does not count either.
    let f = rt
        .block_on(
            dirs.store(&hub.url)
                .hub()
                .unwrap()
                .resolve(&HubRef::parse("org/Tiny-GGUF:Q8_0").unwrap()),
        )
        .unwrap();
    let partial = dirs.store(&hub.url).hub().unwrap().incomplete_path(&f);
    fs::create_dir_all(partial.parent().unwrap()).unwrap();
    fs::write(&partial, &q8[..1000]).unwrap();
    assert!(matches!(
        rt.block_on(
            dirs.store(&hub.url)
                .pull_named("org/Tiny-GGUF:Q8_0", &offline)
        ),
        Err(StoreError::Offline { .. })
    ));

    // The config's offline flag (HF_HUB_OFFLINE) works the same; once complete, offline finds it.
    rt.block_on(
        dirs.store(&hub.url)
            .pull_named("org/Tiny-GGUF:Q8_0", &PullOptions::default()),
    )
    .unwrap();
    let mut cfg = dirs.config("http://127.0.0.1:9");
    cfg.offline = true;
    let models = tempfile::tempdir().unwrap();
    let store = shoal_store::Store::new(models.path()).with_hub(cfg);
    let p = rt
        .block_on(store.pull_named("org/Tiny-GGUF:Q8_0", &PullOptions::default()))
        .unwrap();
    assert_eq!(fs::read(p.path).unwrap(), q8);
    assert!(matches!(
        rt.block_on(store.pull_named("org/Tiny-GGUF:Q4_K_M", &PullOptions::default())),
        Err(StoreError::Offline { .. })
    ));
}

#[test]
fn too_little_disk_space_is_refused_before_any_byte() {
    let hub = FakeHub::start(&[]);
    tiny_repo(&hub);
    let dirs = Dirs::new();
    let mut cfg = dirs.config(&hub.url);
    // More to keep free than any disk has.
    cfg.keep_free = 1 << 60;
    let store = shoal_store::Store::new(dirs.models.path()).with_hub(cfg);
    let e = rt()
        .block_on(store.pull_named("org/Tiny-GGUF:Q4_K_M", &PullOptions::default()))
        .unwrap_err();
    match &e {
        StoreError::DiskSpace {
            needed, free: f, ..
        } => {
            assert_eq!(*needed, 2_000_000 + (1 << 60));
            assert!(*f > 0 && *f < *needed, "{f} free");
        }
        other => panic!("expected DiskSpace, got {other}"),
    }
    assert!(e.to_string().contains("not enough disk space"), "{e}");
    assert!(hub.content_gets().is_empty());
}

#[test]
fn a_cancelled_download_keeps_its_bytes_and_the_next_pull_fetches_only_the_rest() {
    let hub = FakeHub::start(&["--rate", "1000000"]);
    let (q4, _) = tiny_repo(&hub);
    let dirs = Dirs::new();
    let store = dirs.store(&hub.url);
    let rt = rt();
    let cancel = CancelToken::new();
    let c = cancel.clone();
    let opts = PullOptions {
        progress: Arc::new(move |p: &Progress| {
            if p.phase == Phase::Downloading && p.done >= 600_000 {
                c.cancel();
            }
        }),
        cancel,
        offline: false,
    };
    let e = rt
        .block_on(store.pull_named("org/Tiny-GGUF:Q4_K_M", &opts))
        .unwrap_err();
    let StoreError::Cancelled {
        partial,
        done,
        total,
    } = e
    else {
        panic!("expected Cancelled, got {e}");
    };
    assert_eq!(total, q4.len() as u64);
    assert!(done >= 600_000 && done < total, "{done}");
    assert_eq!(fs::metadata(&partial).unwrap().len(), done);
    assert!(partial.to_string_lossy().ends_with(".incomplete"));
    let entry = &store.list()[0];
    assert_eq!(entry.state, State::Partial { have: done });
    assert_eq!(entry.size, total);
    assert!(store.model_file("org/Tiny-GGUF:Q4_K_M").is_err());

    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let sink = seen.clone();
    let opts = PullOptions {
        progress: Arc::new(move |p: &Progress| sink.lock().unwrap().push(p.clone())),
        ..PullOptions::default()
    };
    let p = rt
        .block_on(store.pull_named("org/Tiny-GGUF:Q4_K_M", &opts))
        .unwrap();
    assert_eq!(fs::read(&p.path).unwrap(), q4);
    // Two content requests: the first (whole file, cut short) and the resume. The first one's log line
    // may come last: the server only notices the closed connection when its socket buffer fills.
    let gets = hub.wait_content_gets(2);
    assert_eq!(gets.len(), 2, "{gets:?}");
    let ranged: Vec<_> = gets.iter().filter(|g| g.range.is_some()).collect();
    assert_eq!(ranged.len(), 1, "{gets:?}");
    assert_eq!(
        ranged[0].range.as_deref(),
        Some(format!("bytes={done}-").as_str())
    );
    assert_eq!((ranged[0].status, ranged[0].bytes), (206, total - done));
    let seen = seen.lock().unwrap();
    assert_eq!(
        (&seen[0].phase, seen[0].file.as_str()),
        (&Phase::Resolving, "org/Tiny-GGUF:Q4_K_M")
    );
    assert!(seen.iter().any(|p| p.phase == Phase::Rehashing));
    let dl: Vec<&Progress> = seen
        .iter()
        .filter(|p| p.phase == Phase::Downloading)
        .collect();
    assert!(dl.iter().all(|p| p.resumed_from == done));
    assert!(
        dl.iter().any(|p| p.bytes_per_s > 0.0 && p.eta_s.is_some()),
        "{dl:?}"
    );
    assert_eq!(seen.last().unwrap().phase, Phase::Done);
    assert_eq!(store.list()[0].state, State::Complete);
}

#[test]
fn hub_errors_name_what_is_missing() {
    let hub = FakeHub::start(&[]);
    tiny_repo(&hub);
    let dirs = Dirs::new();
    let store = dirs.store(&hub.url);
    let rt = rt();
    let pull = |name: &str| rt.block_on(store.pull_named(name, &PullOptions::default()));
    assert!(
        matches!(pull("org/Nope"), Err(StoreError::HubNotFound { code, .. }) if code == "RepoNotFound")
    );
    assert!(
        matches!(pull("org/Tiny-GGUF@v9:Q8_0"), Err(StoreError::HubNotFound { code, .. }) if code == "RevisionNotFound")
    );
    assert!(
        matches!(pull("org/Tiny-GGUF/other.gguf"), Err(StoreError::HubNotFound { code, .. }) if code == "EntryNotFound")
    );
    let e = pull("org/Tiny-GGUF:Q5_K_M").unwrap_err();
    assert!(matches!(e, StoreError::NoMatchingGguf { .. }), "{e}");
    assert!(e.to_string().contains("Tiny-Q8_0.gguf"), "{e}");
    // Auto picks Q4_K_M; the id stays as named.
    let p = pull("org/Tiny-GGUF").unwrap();
    assert_eq!(p.id, "org/Tiny-GGUF");
    assert!(p.path.ends_with("Tiny-Q4_K_M.gguf"));
    assert_eq!(
        ModelRef::parse(&p.id).unwrap(),
        ModelRef::Hub(HubRef::parse("org/Tiny-GGUF").unwrap())
    );
}

#[test]
fn the_resolve_url_serves_ranged_reads() {
    let hub = FakeHub::start(&["--token", "t"]);
    let (q4, _) = tiny_repo(&hub);
    let dirs = Dirs::new();
    let mut cfg = dirs.config(&hub.url);
    cfg.token = Some("t".into());
    let h = shoal_store::Hub::new(cfg).unwrap();
    let rt = rt();
    let f = rt
        .block_on(h.resolve(&HubRef::parse("org/Tiny-GGUF:Q4_K_M").unwrap()))
        .unwrap();
    assert_eq!(
        (f.size, f.sha256()),
        (q4.len() as u64, Some(sha256_hex(&q4).as_str()))
    );
    let (url, headers) = h.resolve_url(&f);
    assert!(url.contains(&f.commit), "{url}");
    let got = rt.block_on(async {
        let mut rb = reqwest::Client::new()
            .get(&url)
            .header("Range", "bytes=1000-1999");
        for (k, v) in headers {
            rb = rb.header(k, v);
        }
        let r = rb.send().await.unwrap();
        assert_eq!(r.status().as_u16(), 206);
        r.bytes().await.unwrap()
    });
    assert_eq!(&got[..], &q4[1000..2000]);
}

#[test]
fn rm_deletes_the_folder_and_purge_the_cache_files() {
    let hub = FakeHub::start(&[]);
    let (q4, q8) = tiny_repo(&hub);
    let dirs = Dirs::new();
    let store = dirs.store(&hub.url);
    let rt = rt();
    for name in ["org/Tiny-GGUF:Q4_K_M", "org/Tiny-GGUF:Q8_0"] {
        rt.block_on(store.pull_named(name, &PullOptions::default()))
            .unwrap();
    }
    let blobs = dirs.cache.path().join("models--org--Tiny-GGUF/blobs");
    let dir = store.model_dir("org/Tiny-GGUF:Q4_K_M").unwrap();
    let removed = store.remove("org/Tiny-GGUF:Q4_K_M", false).unwrap();
    assert!(removed.kept.is_empty(), "{removed:?}");
    assert_eq!(removed.removed.last(), Some(&dir), "the folder goes last");
    let mut names: Vec<String> = removed
        .removed
        .iter()
        .filter(|p| p.parent() == Some(dir.as_path()))
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    assert_eq!(names[1], "model.json");
    assert!(
        names[0].ends_with(".gguf"),
        "the link to the snapshot: {names:?}"
    );
    assert!(!dir.exists());
    assert!(
        blobs.join(sha256_hex(&q4)).is_file(),
        "the shared cache is left alone"
    );
    let removed = store.remove("org/Tiny-GGUF:Q8_0", true).unwrap();
    let in_cache = removed
        .removed
        .iter()
        .filter(|p| p.starts_with(dirs.cache.path()))
        .count();
    assert_eq!(in_cache, 2, "the snapshot link and the blob: {removed:?}");
    assert!(!blobs.join(sha256_hex(&q8)).exists());
    assert!(store.list().is_empty());
    assert!(matches!(
        store.remove("org/Tiny-GGUF:Q8_0", false),
        Err(StoreError::NotPresent(..))
    ));
}

#[test]
fn a_hub_answering_a_commit_that_leaves_the_cache_writes_nothing_outside_it() {
    let hub = FakeHub::start(&[]);
    tiny_repo(&hub);
    let dirs = Dirs::new();
    let store = dirs.store(&hub.url);
    let rt = rt();
    // A hostile hub (HF_ENDPOINT can name any server) answers a commit that climbs out of the cache.
    let escape = format!("shoal-escape-{}", std::process::id());
    let outside = dirs.cache.path().parent().unwrap().join(&escape);
    hub.add(REPO, ".commit", format!("../../../{escape}").as_bytes());
    for name in ["org/Tiny-GGUF:q4_k_m", "org/Tiny-GGUF/Tiny-Q8_0.gguf"] {
        let err = rt
            .block_on(store.pull_named(name, &PullOptions::default()))
            .expect_err("a commit that is not a hash must be refused");
        assert!(matches!(err, StoreError::BadAnswer { .. }), "{name}: {err}");
        assert!(err.to_string().contains("40-digit hash"), "{name}: {err}");
    }
    assert!(!outside.exists(), "{} was written", outside.display());
    // Nothing in the models dir claims the model either.
    assert!(store.list().is_empty(), "{:?}", store.list());
}
