//! A tiny GGUF writer for tests: a [`Gguf`] description (metadata entries already encoded, tensors with
//! their dims, type id and bytes) becomes the file's bytes ([`Built`]), with the positions of the fields the
//! corruption tests overwrite. Tensor data is laid out aligned, with no padding after the last tensor, so any
//! cut of the file removes bytes a tensor needs. Also a temporary folder that removes itself.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// GGUF metadata value type ids.
pub const T_U8: u32 = 0;
pub const T_U32: u32 = 4;
pub const T_F32: u32 = 6;
pub const T_BOOL: u32 = 7;
pub const T_STRING: u32 = 8;
pub const T_ARRAY: u32 = 9;

/// ggml tensor type ids used here.
pub const F32: u32 = 0;
pub const Q8_0: u32 = 8;
pub const IQ4_XS: u32 = 23;
pub const TQ2_0: u32 = 35;
pub const MXFP4: u32 = 39;

pub struct Tensor {
    pub name: String,
    /// GGUF order: innermost (row length) first.
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
    /// Offset written in the tensor info; `None`: where the data really is.
    pub offset: Option<u64>,
}

pub struct Gguf {
    pub version: u32,
    /// Key and encoded value (type id, then the value).
    pub metadata: Vec<(String, Vec<u8>)>,
    pub tensors: Vec<Tensor>,
    pub alignment: u64,
}

/// A written file and where its corruptible fields are.
pub struct Built {
    pub bytes: Vec<u8>,
    /// Position of each metadata value (just after its type id).
    pub value_at: HashMap<String, usize>,
    /// Where tensor data starts.
    pub data_start: usize,
}

impl Built {
    pub fn put_u64(&mut self, at: usize, v: u64) {
        self.bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    pub fn put_u32(&mut self, at: usize, v: u32) {
        self.bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
}

pub fn string(s: &[u8]) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(s);
    out
}

pub fn v_u32(x: u32) -> Vec<u8> {
    [T_U32.to_le_bytes(), x.to_le_bytes()].concat()
}

pub fn v_str(s: &str) -> Vec<u8> {
    [T_STRING.to_le_bytes().to_vec(), string(s.as_bytes())].concat()
}

pub fn v_bool(b: u8) -> Vec<u8> {
    [T_BOOL.to_le_bytes().to_vec(), vec![b]].concat()
}

/// An array: its element type and the already-encoded elements (without type ids).
pub fn v_array(elem_type: u32, elems: &[Vec<u8>]) -> Vec<u8> {
    let mut out = T_ARRAY.to_le_bytes().to_vec();
    out.extend(elem_type.to_le_bytes());
    out.extend((elems.len() as u64).to_le_bytes());
    for e in elems {
        out.extend(e);
    }
    out
}

pub fn f32_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn tensor(name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> Tensor {
    Tensor {
        name: name.into(),
        dims: dims.to_vec(),
        type_id,
        data,
        offset: None,
    }
}

/// A small valid llama-like file: strings, arrays (nested too), a bool, and F32 and Q8_0 tensors.
pub fn tiny() -> Gguf {
    let tokens: Vec<Vec<u8>> = ["<s>", "a", "b"]
        .iter()
        .map(|t| string(t.as_bytes()))
        .collect();
    let scores: Vec<Vec<u8>> = [0.0f32, -1.0, -2.0]
        .iter()
        .map(|s| s.to_le_bytes().to_vec())
        .collect();
    let inner = |xs: &[u8]| {
        let mut v = T_U8.to_le_bytes().to_vec();
        v.extend((xs.len() as u64).to_le_bytes());
        v.extend(xs);
        v
    };
    Gguf {
        version: 3,
        metadata: vec![
            ("general.architecture".into(), v_str("llama")),
            ("general.alignment".into(), v_u32(32)),
            ("general.name".into(), v_str("tiny")),
            ("tokenizer.ggml.tokens".into(), v_array(T_STRING, &tokens)),
            ("tokenizer.ggml.scores".into(), v_array(T_F32, &scores)),
            ("shoal.test.flag".into(), v_bool(1)),
            (
                "shoal.test.nested".into(),
                v_array(T_ARRAY, &[inner(&[1, 2]), inner(&[3])]),
            ),
        ],
        tensors: vec![
            tensor(
                "token_embd.weight",
                &[8, 3],
                F32,
                f32_bytes(&(0..24).map(|i| i as f32).collect::<Vec<_>>()),
            ),
            tensor(
                "blk.0.attn_q.weight",
                &[32, 2],
                Q8_0,
                (0..68).map(|i| i as u8).collect(),
            ),
            tensor(
                "output_norm.weight",
                &[8],
                F32,
                f32_bytes(&[1., 2., 3., 4., 5., 6., 7., 8.]),
            ),
        ],
        alignment: 32,
    }
}

impl Gguf {
    pub fn build(&self) -> Built {
        let a = self.alignment as usize;
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        let mut value_at = HashMap::new();
        for (key, value) in &self.metadata {
            out.extend(string(key.as_bytes()));
            value_at.insert(key.clone(), out.len() + 4);
            out.extend(value);
        }
        // Real data positions: each tensor aligned, relative to the data start.
        let mut at = Vec::new();
        let mut next = 0usize;
        for t in &self.tensors {
            at.push(next);
            next = (next + t.data.len()).next_multiple_of(a);
        }
        for (t, &real) in self.tensors.iter().zip(&at) {
            out.extend(string(t.name.as_bytes()));
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.type_id.to_le_bytes());
            out.extend(t.offset.unwrap_or(real as u64).to_le_bytes());
        }
        out.resize(out.len().next_multiple_of(a), 0);
        let data_start = out.len();
        for (t, &real) in self.tensors.iter().zip(&at) {
            out.resize(data_start + real, 0);
            out.extend(&t.data);
        }
        Built {
            bytes: out,
            value_at,
            data_start,
        }
    }
}

/// A folder under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "shoal-gguf-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `bytes` to a file named `name` in the folder.
    pub fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).expect("write test file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
