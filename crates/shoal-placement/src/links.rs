//! [`LinkIndex`]: which link every ordered pair of nodes would use, built once per plan from the
//! topology's link list (O(nodes² + links)), so costing a candidate never scans the list again.
//!
//! Per pair it keeps the best link for one token's activations (forward hops) and the best for a sampled
//! token id (the way back), chosen as [`Topology::best_link`] chooses: cheapest for that message, then
//! the better kind, then the first listed.

use std::collections::HashMap;

use crate::model::{Link, LinkKind, TOKEN_BYTES, Topology};

pub(crate) struct LinkIndex {
    n: usize,
    /// Row-major `n × n`: index into `topology.links` of the best link for activations.
    fwd: Vec<Option<usize>>,
    /// The same for a token id.
    back: Vec<Option<usize>>,
}

impl LinkIndex {
    pub fn new(topo: &Topology, hidden_bytes: u64) -> Self {
        let n = topo.nodes.len();
        let mut ids: HashMap<&str, usize> = HashMap::with_capacity(n);
        for (i, node) in topo.nodes.iter().enumerate() {
            ids.entry(node.id.as_str()).or_insert(i);
        }
        let mut fwd = vec![None; n * n];
        let mut back = vec![None; n * n];
        for (l, link) in topo.links.iter().enumerate() {
            let (Some(&a), Some(&b)) = (ids.get(link.a.as_str()), ids.get(link.b.as_str())) else {
                continue;
            };
            if a == b {
                continue;
            }
            for cell in [a * n + b, b * n + a] {
                for (table, bytes) in [(&mut fwd, hidden_bytes), (&mut back, TOKEN_BYTES)] {
                    if table[cell].is_none_or(|c: usize| link.beats(&topo.links[c], bytes)) {
                        table[cell] = Some(l);
                    }
                }
            }
        }
        LinkIndex { n, fwd, back }
    }

    /// Whether `i` and `j` have any link (never true for `i == j`).
    pub fn linked(&self, i: usize, j: usize) -> bool {
        self.fwd[i * self.n + j].is_some()
    }

    /// The link activations take from `i` to `j`.
    pub fn fwd(&self, i: usize, j: usize) -> Option<usize> {
        self.fwd[i * self.n + j]
    }

    /// The link a token id takes from `i` to `j`.
    pub fn back(&self, i: usize, j: usize) -> Option<usize> {
        self.back[i * self.n + j]
    }
}

/// Cost terms of one link.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LinkCost {
    pub kind: LinkKind,
    half_rtt_us: f64,
    bandwidth: f64,
}

impl LinkCost {
    pub fn of(link: &Link) -> Self {
        LinkCost {
            kind: link.kind,
            half_rtt_us: link.rtt_us() / 2.0,
            bandwidth: link.bandwidth(),
        }
    }

    pub fn transfer_us(&self, bytes: f64) -> f64 {
        bytes / self.bandwidth * 1e6
    }

    pub fn send_us(&self, bytes: f64) -> f64 {
        self.half_rtt_us + self.transfer_us(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NodeInfo;

    fn node(id: &str) -> NodeInfo {
        NodeInfo {
            id: id.parse().unwrap(),
            mem_available: 1,
            speed: 1.0,
            prefill_speed: None,
            head_us: None,
            attention_us: None,
            sample_us: None,
            gpu: None,
            machine: None,
        }
    }

    fn link(a: &str, b: &str, kind: LinkKind, rtt: f64, bw: f64) -> Link {
        Link {
            a: a.parse().unwrap(),
            b: b.parse().unwrap(),
            kind,
            rtt_us: Some(rtt),
            bandwidth_bps: Some(bw),
        }
    }

    #[test]
    fn picks_per_message_size_like_best_link() {
        // Link 0: low latency, thin. Link 1: high latency, fat. Big activations take 1, token ids take 0.
        let topo = Topology {
            nodes: vec![node("a"), node("b"), node("c")],
            links: vec![
                link("a", "b", LinkKind::Wifi, 10.0, 1e6),
                link("b", "a", LinkKind::Ethernet, 1000.0, 1e10),
                link("x", "a", LinkKind::Ethernet, 1.0, 1e10),
                link("c", "c", LinkKind::Loopback, 1.0, 1e10),
            ],
        };
        let idx = LinkIndex::new(&topo, 1_000_000);
        assert_eq!(idx.fwd(0, 1), Some(1));
        assert_eq!(idx.fwd(1, 0), Some(1));
        assert_eq!(idx.back(1, 0), Some(0));
        assert!(idx.linked(0, 1) && !idx.linked(0, 2) && !idx.linked(2, 2));
        for (i, j, bytes) in [(0, 1, 1_000_000), (1, 0, TOKEN_BYTES)] {
            let best = topo
                .best_link(&topo.nodes[i].id, &topo.nodes[j].id, bytes)
                .unwrap();
            let table = if bytes == TOKEN_BYTES {
                idx.back(i, j)
            } else {
                idx.fwd(i, j)
            };
            assert_eq!(&topo.links[table.unwrap()], best);
        }
    }
}
