//! Stop sequences over streamed text: text that may still become a stop sequence is held back, a stop
//! sequence itself is never emitted, even when it spans several tokens.

#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

/// Result of feeding text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fed {
    /// Text that can safely be sent to the client now.
    pub emit: String,
    /// The stop sequence found, if one was: generation must end (nothing from it on is emitted).
    pub stop: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    pub fn feed(&mut self, text: &str) -> Fed {
        if self.stops.is_empty() {
            return Fed {
                emit: text.to_string(),
                stop: None,
            };
        }
        self.pending.push_str(text);
        // The earliest match; of two starting at the same place, the shorter (it completes first).
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, s)| (*at, s.len()));
        if let Some((at, stop)) = first_stop {
            let emit = self.pending[..at].to_string();
            let stop = Some(stop.clone());
            self.pending.clear();
            return Fed { emit, stop };
        }
        let hold = self.held_back_len();
        let split = self.pending.len() - hold;
        let emit = self.pending[..split].to_string();
        self.pending.drain(..split);
        Fed { emit, stop: None }
    }

    /// Text still held back (generation ended for another reason, so it is not a stop sequence).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of some stop sequence.
    fn held_back_len(&self) -> usize {
        let p = &self.pending;
        let mut best = 0;
        for s in &self.stops {
            let max = s.len().saturating_sub(1).min(p.len());
            for len in (best + 1..=max).rev() {
                let start = p.len() - len;
                if p.is_char_boundary(start) && s.starts_with(&p[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let (out, stop) = run_named(stops, pieces);
        (out, stop.is_some())
    }

    /// The output and the stop sequence that ended it.
    fn run_named(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let fed = m.feed(p);
            out.push_str(&fed.emit);
            if fed.stop.is_some() {
                return (out, fed.stop);
            }
        }
        out.push_str(&m.flush());
        (out, None)
    }

    #[test]
    fn no_stops_passes_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn stop_spanning_tokens_is_not_emitted() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D more"]),
            ("hello ".into(), true)
        );
    }

    #[test]
    fn partial_match_released_when_it_diverges() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.feed("xE").emit, "x");
        assert_eq!(m.feed("Nx").emit, "ENx");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["bb", "a"], &["xxbbya"]), ("xx".into(), true));
    }

    #[test]
    fn the_matched_stop_sequence_is_named() {
        assert_eq!(
            run_named(&["bb", "a"], &["xxbbya"]),
            ("xx".into(), Some("bb".into()))
        );
        assert_eq!(
            run_named(&["END", "STOP"], &["one S", "TOP two END"]),
            ("one ".into(), Some("STOP".into()))
        );
        assert_eq!(
            run_named(&["ab", "a"], &["xab"]),
            ("x".into(), Some("a".into())),
            "at one place the shorter stop completes first"
        );
    }

    #[test]
    fn held_text_flushed_at_end() {
        assert_eq!(run(&["ENDING"], &["the END"]), ("the END".into(), false));
    }

    #[test]
    fn multibyte_text_is_split_on_char_boundaries() {
        assert_eq!(run(&["é!"], &["caf", "é", "?"]), ("café?".into(), false));
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true));
    }
}
