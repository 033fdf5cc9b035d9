//! GGUF access: metadata getters and reading single tensors by name (raw bytes or candle tensors).
//!
//! [`GgufFile::open`] parses the header with our own bounds-checked reader (`header.rs`) into candle's
//! [`Content`] (metadata [`Value`]s, and the tensors of the types candle knows) and shoal's directory of every
//! tensor ([`TensorEntry`]: the IQ formats and MXFP4 too), then keeps the file open; [`GgufFile::read_raw`]
//! reads one tensor's bytes into a [`RawTensor`] (checking again that they are inside the file), so a stage
//! reads only its own layers, [`GgufFile::read_raw_rows`] a range of its outermost dimension (a
//! tensor-parallel member's rows, or its experts of a stacked expert tensor), and
//! [`GgufFile::bytes_read`] tells what was read of each tensor. [`types`] names every ggml type id,
//! so an unloadable tensor type is reported by name. A damaged or hostile file is an error naming what is wrong, never a panic or a huge allocation.
//! [`stage_byte_ranges`] (`ranges.rs`) gives the bytes a stage of layers reads (for fetching only those);
//! `names.rs` holds the tensor names the loader and it share.

mod header;
pub(crate) mod names;
pub mod ranges;
pub mod types;

pub use ranges::{stage_byte_ranges, stage_byte_ranges_at};

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};

use candle_core::Device;
use candle_core::quantized::QTensor;
use candle_core::quantized::ggml_file::qtensor_from_ggml;
use candle_core::quantized::gguf_file::{Content, Value};

use crate::error::{ModelError, Result};
use types::GgmlType;

/// An open GGUF file: parsed header, tensor directory and a reader for tensor data.
pub struct GgufFile {
    path: PathBuf,
    file: File,
    content: Content,
    tensors: HashMap<String, TensorEntry>,
    /// Bytes read so far of each tensor (what a tensor-parallel member's loading is checked by).
    read: HashMap<String, u64>,
}

/// One tensor of a file's directory, checked at open: its type (one shoal loads), row-major dims, offset
/// from the start of the tensor data, and size in bytes (within the file).
#[derive(Debug, Clone)]
pub struct TensorEntry {
    pub ty: &'static GgmlType,
    pub dims: Vec<usize>,
    pub offset: u64,
    pub bytes: u64,
}

/// A tensor read as raw GGML bytes, dims in GGML order reversed to row-major (`[rows, cols]`).
pub struct RawTensor {
    pub ty: &'static GgmlType,
    /// Row-major dims: for a weight matrix `[out_features, in_features]`.
    pub dims: Vec<usize>,
    pub data: Vec<u8>,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| ModelError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut file = File::open(path).map_err(io)?;
        let (content, tensors) = header::read(&mut file, path)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            content,
            tensors,
            read: HashMap::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The metadata and the tensors of the types candle knows (see [`GgufFile::tensors`] for all).
    pub fn content(&self) -> &Content {
        &self.content
    }

    /// Every tensor of the file, by name.
    pub fn tensors(&self) -> &HashMap<String, TensorEntry> {
        &self.tensors
    }

    pub fn value(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    /// A hash of the file's token list (`tokenizer.ggml.tokens`, every entry in order): two models
    /// with equal fingerprints number the same text the same way (one can draft for the other).
    /// `None` without a list of strings.
    pub fn token_list_fingerprint(&self) -> Option<u64> {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let Value::Array(tokens) = self.value("tokenizer.ggml.tokens")? else {
            return None;
        };
        let mut h = DefaultHasher::new();
        tokens.len().hash(&mut h);
        for t in tokens {
            let Value::String(s) = t else {
                return None;
            };
            s.hash(&mut h);
        }
        Some(h.finish())
    }

    fn missing(key: &str) -> ModelError {
        ModelError::MissingKey {
            key: key.to_string(),
        }
    }

    pub fn get_u32(&self, key: &str) -> Result<u32> {
        let v = self.value(key).ok_or_else(|| Self::missing(key))?;
        match v {
            Value::U8(x) => Ok(*x as u32),
            Value::U16(x) => Ok(*x as u32),
            Value::U32(x) => Ok(*x),
            Value::U64(x) => u32::try_from(*x).map_err(|_| Self::missing(key)),
            Value::I32(x) => u32::try_from(*x).map_err(|_| Self::missing(key)),
            Value::I64(x) => u32::try_from(*x).map_err(|_| Self::missing(key)),
            _ => Err(Self::missing(key)),
        }
    }

    pub fn get_f32(&self, key: &str) -> Result<f32> {
        match self.value(key).ok_or_else(|| Self::missing(key))? {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            _ => Err(Self::missing(key)),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.value(key).ok_or_else(|| Self::missing(key))? {
            Value::String(s) => Ok(s),
            _ => Err(Self::missing(key)),
        }
    }

    /// Bytes of tensor `name`'s data in the file (quantized size); `None` if there is no such tensor.
    pub fn tensor_bytes(&self, name: &str) -> Option<u64> {
        self.tensors.get(name).map(|t| t.bytes)
    }

    /// Names of every tensor in the file.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Bytes of tensor `name`'s data this handle has read so far (0 for one never read).
    pub fn bytes_read(&self, name: &str) -> u64 {
        self.read.get(name).copied().unwrap_or(0)
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Reads one tensor's raw bytes (only that tensor's bytes are read from disk). The file's size is checked
    /// again first: it may have shrunk since it was opened.
    pub fn read_raw(&mut self, name: &str) -> Result<RawTensor> {
        let info = self.entry(name)?;
        let (ty, dims, bytes) = (info.ty, info.dims.clone(), info.bytes);
        let data = self.read_bytes(name, 0..bytes)?;
        Ok(RawTensor { ty, dims, data })
    }

    /// Reads slices `outer` of a tensor's outermost dimension (rows of a matrix, whole experts of a
    /// stacked 3-D expert tensor): only those bytes are read from disk. The slices of a row-major tensor
    /// are contiguous, each `bytes / dims[0]` long.
    pub fn read_raw_rows(&mut self, name: &str, outer: Range<usize>) -> Result<RawTensor> {
        let info = self.entry(name)?;
        let (ty, mut dims, bytes) = (info.ty, info.dims.clone(), info.bytes);
        let count = dims.first().copied().unwrap_or(0);
        let per = if count == 0 { 0 } else { bytes / count as u64 };
        if outer.start > outer.end || outer.end > count || per * count as u64 != bytes {
            return Err(ModelError::BadInput(format!(
                "{name}: slices {outer:?} of a tensor of dims {dims:?} ({bytes} bytes)"
            )));
        }
        let data = self.read_bytes(name, outer.start as u64 * per..outer.end as u64 * per)?;
        dims[0] = outer.len();
        Ok(RawTensor { ty, dims, data })
    }

    fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })
    }

    /// Bytes `within` (relative to the tensor's first byte) of tensor `name`'s data.
    fn read_bytes(&mut self, name: &str, within: Range<u64>) -> Result<Vec<u8>> {
        let info = self.entry(name)?;
        let path = self.path.display().to_string();
        let io = |source| ModelError::Io {
            path: path.clone(),
            source,
        };
        let size = info.bytes;
        let start = self.content.tensor_data_offset.saturating_add(info.offset);
        let file_len = self.file.metadata().map_err(io)?.len();
        if start.saturating_add(size) > file_len {
            return Err(ModelError::InvalidGguf {
                path: path.clone(),
                message: format!(
                    "tensor {name}: its {size} bytes at {start} run past the end of the file ({file_len} \
                     bytes); has it shrunk since it was opened?"
                ),
            });
        }
        let want = within.end.saturating_sub(within.start);
        let len = usize::try_from(want).map_err(|_| ModelError::InvalidGguf {
            path: path.clone(),
            message: format!("tensor {name}: {want} bytes do not fit this machine's memory"),
        })?;
        let mut data = vec![0u8; len];
        self.file
            .seek(SeekFrom::Start(start + within.start))
            .map_err(io)?;
        self.file.read_exact(&mut data).map_err(io)?;
        *self.read.entry(name.to_string()).or_default() += want;
        Ok(data)
    }

    /// Reads one tensor as a candle quantized tensor on `device` (of a type candle knows).
    pub fn read_qtensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        let raw = self.read_raw(name)?;
        let dtype = raw.ty.dtype.ok_or_else(|| raw.unsupported(name))?;
        Ok(qtensor_from_ggml(dtype, &raw.data, raw.dims, device)?)
    }

    /// Reads a vector tensor (norm weights, biases) as f32: F32 as it is, F16 and BF16 widened (exactly;
    /// converters write these small tensors as F32, but a file with them in half precision is valid and
    /// llama.cpp reads it).
    pub fn read_f32_vec(&mut self, name: &str) -> Result<Vec<f32>> {
        let raw = self.read_raw(name)?;
        let two = |c: &[u8]| u16::from_le_bytes([c[0], c[1]]);
        Ok(match raw.ty.id {
            0 => raw
                .data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            1 => raw
                .data
                .chunks_exact(2)
                .map(|c| half::f16::from_bits(two(c)).to_f32())
                .collect(),
            30 => raw
                .data
                .chunks_exact(2)
                .map(|c| half::bf16::from_bits(two(c)).to_f32())
                .collect(),
            _ => return Err(raw.unsupported(name)),
        })
    }
}

impl RawTensor {
    /// The error for a tensor (`name`) whose type cannot serve where it was asked for.
    pub fn unsupported(&self, name: &str) -> ModelError {
        ModelError::UnsupportedTensorType {
            name: name.to_string(),
            dtype: format!("{} (id {})", self.ty.name, self.ty.id),
        }
    }
}
