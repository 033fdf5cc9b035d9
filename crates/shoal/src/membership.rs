//! Joining and leaving: `shoal invite` (an invite in this node's book, printed as a token),
//! `serve --join TOKEN` (enrolls with a member, which hands out the cluster key sealed for this node;
//! see `shoal_cluster::invite`) and `shoal remove NODE` (asks a running node to take a member out for
//! good).

use std::time::Duration;

use anyhow::Context;
use shoal_cluster::identity;
use shoal_cluster::invite::{EnrollReply, InviteBook, InviteToken};

use crate::cli::{ClusterArgs, InviteArgs, RemoveArgs};

/// How long one enroll request may take.
const ENROLL_TIMEOUT: Duration = Duration::from_secs(15);

/// `shoal invite`: records an invite in this node's book and prints its token on stdout.
pub fn invite(args: &InviteArgs) -> anyhow::Result<()> {
    let uses = if args.reusable { None } else { Some(args.uses) };
    anyhow::ensure!(uses != Some(0), "--uses must be at least 1");
    let ttl = parse_ttl(&args.ttl)?;
    let expires = ttl.map(|t| unix_now() + t.as_secs());
    let mut urls = args.urls.clone();
    if urls.is_empty() {
        urls = shoal_cluster::facts::reachable_ipv4s()
            .into_iter()
            .map(|ip| format!("http://{ip}:{}", args.api_port))
            .collect();
    }
    anyhow::ensure!(
        !urls.is_empty(),
        "no address to put in the token: give this node's API with --url http://HOST:PORT"
    );
    let state_dir = crate::cli::state_dir_or_default(&args.state_dir);
    let invite = InviteBook::new(&state_dir).create(uses, expires)?;
    let secret: [u8; 32] = (0..32)
        .map(|i| u8::from_str_radix(&invite.secret[2 * i..2 * i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()
        .ok()
        .and_then(|v| v.try_into().ok())
        .context("the invite book holds a damaged secret")?;
    let token = InviteToken {
        id: invite.id.clone(),
        secret,
        urls,
    };
    println!("{}", token.encode());
    let uses = match uses {
        Some(1) => "one machine".to_string(),
        Some(n) => format!("{n} machines"),
        None => "any number of machines".to_string(),
    };
    let until = match ttl {
        Some(t) => format!("for {}", humantime(t)),
        None => "with no expiry".to_string(),
    };
    eprintln!(
        "shoal: invite {} lets {uses} join {until}: on the other machine run `shoal serve --join <token>` \
         (this node's `shoal serve` must be running)",
        invite.id
    );
    Ok(())
}

/// The cluster key and the addresses to dial, from `--cluster-key` / `--cluster-key-file`, a `--join`
/// token (enrolling with a member, or the key stored by an earlier join with the same token), or this
/// node's own key.
pub async fn cluster_key_and_peers(args: &ClusterArgs) -> anyhow::Result<(String, Vec<String>)> {
    let mut peers = args.peers.clone();
    let Some(text) = &args.join else {
        return Ok((args.cluster_key()?, peers));
    };
    let token = InviteToken::parse(text).ok_or_else(|| {
        anyhow::anyhow!("--join: not a token printed by `shoal invite` (shoal2:…)")
    })?;
    let state_dir = args.state_dir();
    let node = identity::load_or_create(&state_dir)?.public().to_peer_id();
    if let Some((key, joined)) = identity::joined_key(&state_dir, &token.id) {
        tracing::info!(invite = %token.id, "joining with the key this invite gave before");
        peers.extend(joined.addrs);
        return Ok((key, peers));
    }
    let (key, reply) = enroll(&token, &node.to_string()).await?;
    let joined = identity::Joined {
        invite: token.id.clone(),
        addrs: dialable(&reply.addrs, &token.urls),
    };
    identity::store_joined_key(&state_dir, &joined, &key)?;
    peers.extend(joined.addrs);
    println!("shoal: joined with invite {}", token.id);
    Ok((key, peers))
}

/// Asks the token's URLs in turn until one member honours the invite.
async fn enroll(token: &InviteToken, node: &str) -> anyhow::Result<(String, EnrollReply)> {
    let client = reqwest::Client::builder()
        .timeout(ENROLL_TIMEOUT)
        .build()
        .context("building the HTTP client")?;
    let request = token.request(node);
    let mut problems = Vec::new();
    for url in &token.urls {
        let endpoint = format!(
            "{}{}",
            url.trim_end_matches('/'),
            shoal_api::membership::ENROLL_PATH
        );
        let answer = match client.post(&endpoint).json(&request).send().await {
            Ok(a) => a,
            Err(e) => {
                problems.push(format!("{url}: {e}"));
                continue;
            }
        };
        let status = answer.status();
        if !status.is_success() {
            let body: serde_json::Value = answer.json().await.unwrap_or_default();
            let message = body["error"]["message"].as_str().unwrap_or("").to_string();
            // A refusal is final: another member would refuse the same invite.
            anyhow::bail!("{url} refused the invite ({status}): {message}");
        }
        let reply: EnrollReply = answer
            .json()
            .await
            .with_context(|| format!("{url} answered something that is not an enroll reply"))?;
        let key = token.open(node, &reply)?;
        return Ok((key, reply));
    }
    anyhow::bail!(
        "no member in the token answered: {} (is `shoal serve` running there?)",
        problems.join("; ")
    )
}

/// The members' cluster addresses, with an unspecified host (a node listening on 0.0.0.0) replaced by
/// the host the token reached.
fn dialable(addrs: &[String], urls: &[String]) -> Vec<String> {
    let hosts: Vec<String> = urls
        .iter()
        .filter_map(|u| reqwest::Url::parse(u).ok()?.host_str().map(String::from))
        .collect();
    let mut out = Vec::new();
    for a in addrs {
        if a.contains("/ip4/0.0.0.0/") || a.contains("/ip6/::/") {
            for h in &hosts {
                let proto = if h.contains(':') { "ip6" } else { "ip4" };
                let h = h.trim_start_matches('[').trim_end_matches(']');
                let rest = a.splitn(4, '/').nth(3).unwrap_or("");
                out.push(format!("/{proto}/{h}/{rest}"));
            }
        } else {
            out.push(a.clone());
        }
    }
    out.sort();
    out.dedup();
    out
}

/// `shoal remove NODE`: asks the node at `--url` to take NODE out of the cluster.
pub fn remove(args: &RemoveArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        let mut req = reqwest::Client::new()
            .post(format!("{}/cluster/remove", args.url.trim_end_matches('/')))
            .json(&serde_json::json!({ "node": args.node }));
        if let Some(key) = &args.api_key {
            req = req.bearer_auth(key);
        }
        let answer = req
            .send()
            .await
            .with_context(|| format!("no shoal node answered at {}", args.url))?;
        let status = answer.status();
        let body: serde_json::Value = answer.json().await.unwrap_or_default();
        if !status.is_success() {
            let message = body["error"]["message"].as_str().unwrap_or("");
            anyhow::bail!("{status}: {message}");
        }
        let removed = &body["removed"];
        println!(
            "removed {} {}: every member refuses it from now on",
            removed["id"].as_str().unwrap_or(""),
            removed["name"].as_str().unwrap_or("")
        );
        Ok(())
    })
}

/// The longest expiry an invite may have: ten years (`never` for none).
const MAX_TTL_SECS: u64 = 3650 * 86_400;

/// `24h`, `90m`, `30s`, `7d` (at most [`MAX_TTL_SECS`]), or `never`.
fn parse_ttl(text: &str) -> anyhow::Result<Option<Duration>> {
    let t = text.trim();
    if t == "never" {
        return Ok(None);
    }
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = num
        .parse()
        .with_context(|| format!("--ttl '{text}': expected e.g. 24h, 90m, 7d or never"))?;
    let unit_secs: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" | "" => 3600,
        "d" => 86_400,
        _ => anyhow::bail!("--ttl '{text}': the unit is s, m, h or d"),
    };
    anyhow::ensure!(n > 0, "--ttl must be longer than 0");
    let secs = n
        .checked_mul(unit_secs)
        .filter(|&s| s <= MAX_TTL_SECS)
        .with_context(|| {
            format!(
                "--ttl '{text}': at most {} d (use `never` for no expiry)",
                MAX_TTL_SECS / 86_400
            )
        })?;
    Ok(Some(Duration::from_secs(secs)))
}

fn humantime(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s % 86_400 == 0 => format!("{} d", s / 86_400),
        s if s % 3600 == 0 => format!("{} h", s / 3600),
        s if s % 60 == 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_read_like_people_write_them() {
        assert_eq!(parse_ttl("never").unwrap(), None);
        assert_eq!(parse_ttl("90m").unwrap(), Some(Duration::from_secs(5400)));
        assert_eq!(parse_ttl("2").unwrap(), Some(Duration::from_secs(7200)));
        assert_eq!(parse_ttl("7d").unwrap(), Some(Duration::from_secs(604_800)));
        assert_eq!(
            parse_ttl("3650d").unwrap(),
            Some(Duration::from_secs(MAX_TTL_SECS))
        );
        // Overflows (u64::MAX hours) and expiries past any use are refused, not wrapped.
        for bad in [
            "",
            "h",
            "0m",
            "5y",
            "-1h",
            "3651d",
            "18446744073709551615h",
            "99999999999999999999s",
        ] {
            assert!(parse_ttl(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_unspecified_listen_address_takes_the_host_the_token_reached() {
        let addrs = [
            "/ip4/0.0.0.0/tcp/52416/p2p/12D3Koo".to_string(),
            "/ip4/10.0.0.3/tcp/52416/p2p/12D3Kxx".to_string(),
        ];
        assert_eq!(
            dialable(&addrs, &["http://10.0.0.2:52415".to_string()]),
            vec![
                "/ip4/10.0.0.2/tcp/52416/p2p/12D3Koo".to_string(),
                "/ip4/10.0.0.3/tcp/52416/p2p/12D3Kxx".to_string(),
            ]
        );
    }
}
