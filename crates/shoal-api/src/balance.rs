//! Which instance of a model serves a request: least predicted queued work, with prefix affinity
//! (replicas and load balancing, PRD 3.2).
//!
//! - [`Candidate`]: one ready instance as this node sees it — where it answers ([`Target`]: this node's
//!   engine or another node's API), what it is working on, how fast it decodes.
//! - [`choose`] is the pure decision. An instance's predicted queued work is `(work + 1) / speed`
//!   (seconds per token of the requests it holds, this one included); the least wins (ties: this node's
//!   own engine, then the instance id). Prefix affinity, as SGLang's cache-aware router: the instance
//!   this node last sent the longest prefix of this prompt to (its KV prefix cache likely still holds
//!   it) wins instead, unless it is imbalanced against the least loaded — more than
//!   [`Policy::margin_requests`] requests behind at its speed *and* [`Policy::margin_ratio`] times its
//!   predicted work.
//! - [`Balancer`] (one per node, in the API state) holds what the decision needs that no fact carries:
//!   requests this node sent to each instance that have not finished ([`InFlight`] guards, dropped with
//!   the response body), how many it sent there in all, and a bounded LRU memory of prompt-prefix
//!   hashes per instance ([`PrefixMemory`]; [`prompt_prefixes`] hashes the request's prompt text at
//!   512 B, 1 KiB, 2 KiB, … of it). [`Balancer::route`] decides and counts under one lock, so a burst of
//!   concurrent requests spreads instead of all seeing the same idle instance.
//!
//! An instance's `work` is the larger of what its driver published (running + queued, refreshed every
//! second; for this node's engine its live counters instead) and what this node has in flight there: the
//! published figure already holds this node's requests that were running when it was published, so
//! adding the two would count them twice.
//!
//! Flow: `cluster::forward_to_driver` → [`candidates`] (the cluster snapshot + this node's engine
//! counters) → [`Balancer::route`] → serve here or relay to the chosen driver's API.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hasher};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use shoal_cluster::Snapshot;

/// Where a request is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// This node's engine for the model.
    Local,
    /// Another node's API (base URL), which serves it with its own engine.
    Remote { api_url: String },
}

/// A ready instance of the requested model, as this node sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Instance id (the key of in-flight counts and prefix memory).
    pub instance: String,
    pub target: Target,
    /// Requests it is running or queueing (see the module doc for which figure).
    pub work: f64,
    /// Decode tokens per second of one stream (measured, or predicted: see [`candidates`]), > 0.
    pub speed: f64,
    /// Bytes of this request's prompt prefix this node recently sent to it (0: none).
    pub prefix_match: usize,
}

impl Candidate {
    /// Predicted queued work: seconds per token of everything it holds plus this request.
    fn cost(&self) -> f64 {
        (self.work + 1.0) / self.speed
    }
}

/// When prefix affinity gives way to load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Requests (at the affine instance's speed) it may be behind the least loaded one.
    pub margin_requests: f64,
    /// And by how many times the least loaded one's predicted work.
    pub margin_ratio: f64,
}

impl Default for Policy {
    /// Two requests and 1.5×: a cached prefix saves its prefill, a queue two requests deep costs more
    /// than a short prompt's prefill on a CPU (SGLang uses 64 and 1.5 for GPU batch sizes).
    fn default() -> Self {
        Policy {
            margin_requests: 2.0,
            margin_ratio: 1.5,
        }
    }
}

/// The index of the candidate that serves the request; `None` when there is none.
pub fn choose(candidates: &[Candidate], policy: Policy) -> Option<usize> {
    let better = |a: &Candidate, b: &Candidate| {
        a.cost()
            .total_cmp(&b.cost())
            .then_with(|| (b.target == Target::Local).cmp(&(a.target == Target::Local)))
            .then_with(|| a.instance.cmp(&b.instance))
    };
    let least = (0..candidates.len()).min_by(|&a, &b| better(&candidates[a], &candidates[b]))?;
    let affine = (0..candidates.len())
        .filter(|&i| candidates[i].prefix_match > 0)
        .min_by(|&a, &b| {
            let (ca, cb) = (&candidates[a], &candidates[b]);
            cb.prefix_match
                .cmp(&ca.prefix_match)
                .then_with(|| better(ca, cb))
        });
    let Some(affine) = affine else {
        return Some(least);
    };
    let (a, l) = (&candidates[affine], &candidates[least]);
    let behind = (a.cost() - l.cost()) * a.speed;
    let imbalanced = behind > policy.margin_requests && a.cost() > policy.margin_ratio * l.cost();
    Some(if imbalanced { least } else { affine })
}

/// Prompt-prefix boundaries, in bytes: 512 · 2^k up to this length.
const FIRST_PREFIX: usize = 512;

/// The fields of a generation request that hold its prompt (chat messages, a system text, a prompt or
/// an input), whatever the API.
#[derive(Deserialize)]
struct PromptFields {
    #[serde(default)]
    system: Option<serde_json::Value>,
    #[serde(default)]
    messages: Option<serde_json::Value>,
    #[serde(default)]
    prompt: Option<serde_json::Value>,
    #[serde(default)]
    input: Option<serde_json::Value>,
}

/// Hashes of the prompt of a request body at 512 B, 1 KiB, 2 KiB, … of its text (the JSON of its
/// `system`, `messages`, `prompt` and `input`, in that order, as the client sent them), shortest first;
/// empty for a prompt shorter than 512 B or a body that is not JSON. A conversation that grows keeps
/// the hashes of its earlier turns.
pub fn prompt_prefixes(body: &[u8]) -> Vec<(usize, u64)> {
    let Ok(fields) = serde_json::from_slice::<PromptFields>(body) else {
        return Vec::new();
    };
    let mut text = Vec::new();
    for v in [fields.system, fields.messages, fields.prompt, fields.input]
        .into_iter()
        .flatten()
    {
        // Writing a parsed value to memory cannot fail.
        let _ = serde_json::to_writer(&mut text, &v);
    }
    prefix_hashes(&text)
}

/// `(length, hash of text[..length])` for each boundary length that `text` reaches.
fn prefix_hashes(text: &[u8]) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    let mut hasher = DefaultHasher::new();
    let mut done = 0;
    let mut len = FIRST_PREFIX;
    while len <= text.len() {
        hasher.write(&text[done..len]);
        out.push((len, hasher.finish()));
        done = len;
        len *= 2;
    }
    out
}

/// Prompt-prefix hashes this node sent to each instance, least recently used forgotten first.
#[derive(Debug)]
pub struct PrefixMemory {
    capacity: usize,
    tick: u64,
    /// (instance, prefix hash) → when last used.
    used: HashMap<(String, u64), u64>,
    /// When last used → (instance, prefix hash): the oldest first.
    order: BTreeMap<u64, (String, u64)>,
}

impl PrefixMemory {
    /// A memory of at most `capacity` (instance, prefix) entries.
    pub fn new(capacity: usize) -> Self {
        PrefixMemory {
            capacity: capacity.max(1),
            tick: 0,
            used: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.used.len()
    }

    pub fn is_empty(&self) -> bool {
        self.used.is_empty()
    }

    /// The longest of `prefixes` (as [`prompt_prefixes`] gives them) remembered for `instance`, in bytes.
    pub fn longest(&self, instance: &str, prefixes: &[(usize, u64)]) -> usize {
        prefixes
            .iter()
            .rev()
            .find(|(_, h)| self.used.contains_key(&(instance.to_string(), *h)))
            .map_or(0, |(len, _)| *len)
    }

    /// Remembers that `prefixes` went to `instance` now.
    pub fn remember(&mut self, instance: &str, prefixes: &[(usize, u64)]) {
        for (_, h) in prefixes {
            self.tick += 1;
            let key = (instance.to_string(), *h);
            if let Some(old) = self.used.insert(key.clone(), self.tick) {
                self.order.remove(&old);
            }
            self.order.insert(self.tick, key);
        }
        while self.used.len() > self.capacity {
            let Some((_, key)) = self.order.pop_first() else {
                break;
            };
            self.used.remove(&key);
        }
    }
}

/// (instance, prefix) entries a node remembers: about 800 long prompts of ten boundaries each.
const PREFIX_MEMORY: usize = 8192;

/// What this node sent to one instance (`GET /state` → `routing`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RouteStats {
    /// Requests sent there since this node started.
    pub routed: u64,
    /// Of those, not finished yet.
    pub in_flight: u64,
}

#[derive(Debug)]
struct Book {
    routes: BTreeMap<String, RouteStats>,
    prefixes: PrefixMemory,
}

/// This node's routing memory (see the module doc). Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Balancer {
    book: Mutex<Book>,
    policy: Policy,
}

impl Default for Balancer {
    fn default() -> Self {
        Balancer::new(Policy::default())
    }
}

impl Balancer {
    pub fn new(policy: Policy) -> Self {
        Balancer {
            book: Mutex::new(Book {
                routes: BTreeMap::new(),
                prefixes: PrefixMemory::new(PREFIX_MEMORY),
            }),
            policy,
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Chooses among `candidates` for a prompt with `prefixes` and counts the request as in flight
    /// there until the returned guard drops; `None` when there is no candidate.
    pub fn route(
        self: &Arc<Self>,
        mut candidates: Vec<Candidate>,
        prefixes: &[(usize, u64)],
    ) -> Option<(Candidate, InFlight)> {
        let mut book = self.book();
        for c in &mut candidates {
            let mine = book.routes.get(&c.instance).map_or(0, |r| r.in_flight);
            c.work = c.work.max(mine as f64);
            c.prefix_match = book.prefixes.longest(&c.instance, prefixes);
        }
        let chosen = candidates.swap_remove(choose(&candidates, self.policy)?);
        let stats = book.routes.entry(chosen.instance.clone()).or_default();
        stats.routed += 1;
        stats.in_flight += 1;
        book.prefixes.remember(&chosen.instance, prefixes);
        let guard = InFlight {
            balancer: self.clone(),
            instance: chosen.instance.clone(),
        };
        Some((chosen, guard))
    }

    /// What this node sent to each instance.
    pub fn stats(&self) -> BTreeMap<String, RouteStats> {
        self.book().routes.clone()
    }
}

/// A request this node sent to an instance, counted until dropped.
#[derive(Debug)]
pub struct InFlight {
    balancer: Arc<Balancer>,
    instance: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(r) = self.balancer.book().routes.get_mut(&self.instance) {
            r.in_flight = r.in_flight.saturating_sub(1);
        }
    }
}

/// Instance key of this node's engine when no instance in the table is driven here (an engine started
/// outside the cluster, e.g. local stages for development).
pub const LOCAL_ENGINE: &str = "local";

/// The ready instances of `model`, one per driving node: this node's engine (`local_work`: its live
/// running + waiting count; `None` when this node serves no engine for the model) and every other
/// driver whose API is known. `work` is the live count here, what the driver published elsewhere
/// ([`Balancer::route`] adds this node's own count). `speed` is each one's measured one-stream decode
/// rate when every candidate has one, else each one's predicted rate (the planner's), so that figures
/// of one kind are compared; one without a figure gets the others' mean.
pub fn candidates(snap: &Snapshot, model: &str, local_work: Option<f64>) -> Vec<Candidate> {
    let state = &snap.state;
    let me = state.me().id.as_str();
    let view = state.view();
    // Each candidate with its measured and its predicted speed.
    let mut out: Vec<(Candidate, Option<f64>, Option<f64>)> = Vec::new();
    for inst in view.instances_of(model).filter(|i| i.is_ready()) {
        let Some(driver) = inst.record.driver() else {
            continue;
        };
        let local = driver == me;
        if local && local_work.is_none() {
            continue; // ready, but its engine is not registered here yet
        }
        let Some(facts) = state.facts_of(driver) else {
            continue;
        };
        let target = if local {
            Target::Local
        } else {
            match &facts.api_url {
                Some(url) => Target::Remote {
                    api_url: url.clone(),
                },
                None => continue,
            }
        };
        if out.iter().any(|(c, _, _)| c.target == target) {
            continue; // a node serves one engine per model: its first ready instance stands for it
        }
        let load = facts.load.get(&inst.record.id);
        let published = load.map_or(0.0, |l| f64::from(l.running) + f64::from(l.queued));
        let measured = load.and_then(|l| l.decode_tok_s).filter(|s| *s > 0.0);
        let predicted = Some(1e6 / inst.record.predicted_token_latency_us)
            .filter(|s| s.is_finite() && *s > 0.0);
        let work = match local_work {
            Some(live) if local => live,
            _ => published,
        };
        let candidate = Candidate {
            instance: inst.record.id.to_string(),
            target,
            work,
            speed: 0.0,
            prefix_match: 0,
        };
        out.push((candidate, measured, predicted));
    }
    if let Some(work) = local_work
        && !out.iter().any(|(c, _, _)| c.target == Target::Local)
    {
        let candidate = Candidate {
            instance: LOCAL_ENGINE.to_string(),
            target: Target::Local,
            work,
            speed: 0.0,
            prefix_match: 0,
        };
        out.push((candidate, None, None));
    }
    let all_measured = out.iter().all(|(_, m, _)| m.is_some());
    let speeds: Vec<Option<f64>> = out
        .iter()
        .map(|(_, m, p)| if all_measured { *m } else { *p })
        .collect();
    let known: Vec<f64> = speeds.iter().flatten().copied().collect();
    let fallback = if known.is_empty() {
        1.0
    } else {
        known.iter().sum::<f64>() / known.len() as f64
    };
    out.into_iter()
        .zip(speeds)
        .map(|((mut c, _, _), speed)| {
            c.speed = speed.unwrap_or(fallback);
            c
        })
        .collect()
}

#[cfg(test)]
mod tests;
