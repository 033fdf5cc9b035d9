//! The prompts of the serving benchmark: each request of a run has a distinct prompt of about 32 tokens
//! whose first words differ from every other's (so no prefix cache helps), and the long prompts of the
//! long-prompt scenario are made of the same vocabulary.

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
pub(crate) fn prompt(i: usize) -> String {
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
pub(crate) fn long_prompt(i: usize, words: usize) -> String {
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
pub(crate) fn first_prompt(offset: Option<usize>) -> usize {
    offset.unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        (now.as_millis() % PROMPT_CYCLE as u128) as usize
    })
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
}
