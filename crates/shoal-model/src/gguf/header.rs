//! The bounds-checked GGUF v2/v3 header reader: [`read`] parses the magic, version, metadata and tensor
//! directory of a file into candle's public [`Content`] (so the tokenizer and config code keep reading
//! [`Value`]s) plus shoal's own directory of every tensor ([`TensorEntry`]: candle's `TensorInfo` cannot
//! hold the types candle lacks, such as the IQ formats, so `Content::tensor_infos` lists only the others),
//! through a buffered reader ([`Source`]) that knows how many bytes the file has left.
//!
//! Nothing the file declares is trusted before it is checked:
//! - every read of a fixed-size field first checks that the file still holds those bytes;
//! - a string's length is checked against the bytes left before its buffer is allocated, and the bytes must be
//!   UTF-8; an array's length times its element type's smallest encoding is checked likewise, its buffer is
//!   pre-sized to at most [`PREALLOC_ELEMENTS`] and grows only with elements actually read, and arrays nest at
//!   most [`MAX_DEPTH`] deep;
//! - the tensor and metadata counts are checked against the smallest encoding of that many entries;
//! - each tensor has 1..=4 dimensions, each ≥ 1, whose product fits [`MAX_ELEMENTS`]; a known ggml type that
//!   shoal can load (see [`super::types`]) and rows that are whole blocks; an offset aligned to
//!   `general.alignment` (default 32); bytes that end inside the file; a name no other tensor has.
//!
//! So every allocation is bounded by bytes the file really holds, and every problem is a
//! [`ModelError::InvalidGguf`] naming what is wrong (or, for a tensor type shoal cannot load,
//! [`ModelError::UnsupportedTensorType`] naming the tensor and its type: "TQ2_0 (id 35)"), never a panic.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value, ValueType, VersionedMagic};

use super::TensorEntry;
use super::types::{GgmlType, ggml_type};
use crate::error::{ModelError, Result};

/// Alignment of tensor data when the file does not set `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest nesting of arrays in metadata (real files use one level).
pub const MAX_DEPTH: usize = 8;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// Most elements one tensor may have (2^50; no tensor of a file that fits on a disk comes close).
pub const MAX_ELEMENTS: u64 = 1 << 50;
/// Largest number of elements an array's buffer is sized for before they are read.
pub const PREALLOC_ELEMENTS: usize = 4096;
/// Read buffer for the header (a header with a 262k-token vocabulary is 10+ MB).
const BUFFER_BYTES: usize = 1 << 20;

/// Smallest encoding of one metadata entry: key length (8) + empty key + value type (4) + a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest encoding of one tensor info: name length (8) + empty name + n_dims (4) + one dim (8) + type (4)
/// + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// Parses the header of the GGUF file `file` (at `path`, for messages) and checks its tensor directory
/// against the file's size: the metadata and the tensors candle can represent as candle's [`Content`],
/// and every tensor in shoal's directory.
pub fn read(file: &mut File, path: &Path) -> Result<(Content, HashMap<String, TensorEntry>)> {
    let io = |source| ModelError::Io {
        path: path.display().to_string(),
        source,
    };
    let size = file.metadata().map_err(io)?.len();
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut src = Source {
        inner: BufReader::with_capacity(BUFFER_BYTES, file),
        pos: 0,
        size,
        path,
    };
    let magic = read_magic(&mut src)?;
    let n_tensors = src.u64(&|| "the tensor count".into())?;
    let n_kv = src.u64(&|| "the metadata entry count".into())?;
    let needed = n_kv
        .checked_mul(MIN_KV_BYTES)
        .zip(n_tensors.checked_mul(MIN_TENSOR_INFO_BYTES))
        .and_then(|(a, b)| a.checked_add(b));
    if needed.is_none_or(|n| n > src.left()) {
        return Err(src.bad(format!(
            "the header declares {n_tensors} tensors and {n_kv} metadata entries, more than the {} bytes \
             left in the file can hold",
            src.left()
        )));
    }
    let metadata = read_metadata(&mut src, n_kv)?;
    let alignment = alignment(&metadata).map_err(|m| src.bad(m))?;
    let tensors = read_tensor_infos(&mut src, n_tensors, alignment)?;
    let data_start = src
        .pos
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| src.bad(format!("alignment {alignment} overflows the data offset")))?;
    let mut tensor_infos = HashMap::with_capacity(tensors.len());
    let mut entries = HashMap::with_capacity(tensors.len());
    for (name, entry) in tensors {
        let start = data_start.checked_add(entry.offset);
        match start.and_then(|s| s.checked_add(entry.bytes)) {
            Some(end) if end <= size => {}
            _ => {
                return Err(src.bad(format!(
                    "tensor {name}: its {} bytes at offset {} (data starts at {data_start}) run past \
                     the end of the file ({size} bytes)",
                    entry.bytes, entry.offset
                )));
            }
        }
        if let Some(dtype) = entry.ty.dtype {
            let info = TensorInfo {
                ggml_dtype: dtype,
                shape: entry.dims.clone().into(),
                offset: entry.offset,
            };
            tensor_infos.insert(name.clone(), info);
        }
        entries.insert(name, entry);
    }
    let content = Content {
        magic,
        metadata,
        tensor_infos,
        tensor_data_offset: data_start,
    };
    Ok((content, entries))
}

fn read_magic(src: &mut Source) -> Result<VersionedMagic> {
    let magic = src.fixed::<4>(&|| "the magic".into())?;
    if magic != *b"GGUF" {
        let message = if magic == *b"FUGG" {
            "big-endian GGUF files are not supported".to_string()
        } else {
            format!("not a GGUF file: it starts with {magic:02x?}, not \"GGUF\"")
        };
        return Err(src.bad(message));
    }
    match src.u32(&|| "the version".into())? {
        2 => Ok(VersionedMagic::GgufV2),
        3 => Ok(VersionedMagic::GgufV3),
        v => Err(src.bad(format!(
            "GGUF version {v} is not supported (only versions 2 and 3)"
        ))),
    }
}

fn read_metadata(src: &mut Source, n_kv: u64) -> Result<HashMap<String, Value>> {
    let mut metadata = HashMap::with_capacity(prealloc(n_kv));
    for i in 0..n_kv {
        let key = src.string(&|| format!("the key of metadata entry {i}"))?;
        let what = || format!("metadata '{key}'");
        let ty = src.value_type(&what)?;
        let value = src.value(ty, 0, &what)?;
        match metadata.entry(key) {
            Entry::Occupied(e) => {
                return Err(src.bad(format!("metadata key '{}' appears twice", e.key())));
            }
            Entry::Vacant(e) => {
                e.insert(value);
            }
        }
    }
    Ok(metadata)
}

/// `general.alignment`: a power of two, [`DEFAULT_ALIGNMENT`] when absent.
fn alignment(metadata: &HashMap<String, Value>) -> std::result::Result<u64, String> {
    let Some(v) = metadata.get("general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let a = match v {
        Value::U8(x) => u64::from(*x),
        Value::U16(x) => u64::from(*x),
        Value::U32(x) => u64::from(*x),
        Value::U64(x) => *x,
        Value::I8(x) => u64::try_from(*x).unwrap_or(0),
        Value::I16(x) => u64::try_from(*x).unwrap_or(0),
        Value::I32(x) => u64::try_from(*x).unwrap_or(0),
        Value::I64(x) => u64::try_from(*x).unwrap_or(0),
        other => {
            return Err(format!(
                "general.alignment must be an integer, not {:?}",
                other.value_type()
            ));
        }
    };
    if !a.is_power_of_two() {
        return Err(format!("general.alignment {v:?} is not a power of two"));
    }
    Ok(a)
}

/// Reads the tensor directory: each tensor's name and checked entry, in file order.
fn read_tensor_infos(
    src: &mut Source,
    n_tensors: u64,
    alignment: u64,
) -> Result<Vec<(String, TensorEntry)>> {
    let mut tensors = Vec::with_capacity(prealloc(n_tensors));
    let mut seen = HashSet::with_capacity(prealloc(n_tensors));
    for i in 0..n_tensors {
        let name = src.string(&|| format!("the name of tensor {i}"))?;
        let n_dims = src.u32(&|| format!("the dimension count of tensor {name}"))?;
        if !(1..=MAX_DIMS).contains(&n_dims) {
            return Err(src.bad(format!(
                "tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
            )));
        }
        let mut dims = Vec::with_capacity(MAX_DIMS as usize);
        for d in 0..n_dims {
            dims.push(src.u64(&|| format!("dimension {d} of tensor {name}"))?);
        }
        let type_id = src.u32(&|| format!("the type of tensor {name}"))?;
        let offset = src.u64(&|| format!("the data offset of tensor {name}"))?;
        let (ty, bytes) = tensor_layout(&name, &dims, type_id).map_err(|e| e.at(src.path))?;
        if offset % alignment != 0 {
            return Err(src.bad(format!(
                "tensor {name}: data offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        if !seen.insert(name.clone()) {
            return Err(src.bad(format!("tensor {name} appears twice")));
        }
        // GGUF stores dims innermost first; candle's shapes are outermost first.
        let shape: Vec<usize> = dims
            .iter()
            .rev()
            .map(|&d| usize::try_from(d))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| {
                src.bad(format!(
                    "tensor {name}: dims {dims:?} do not fit this machine"
                ))
            })?;
        let entry = TensorEntry {
            ty,
            dims: shape,
            offset,
            bytes,
        };
        tensors.push((name, entry));
    }
    Ok(tensors)
}

/// A tensor-level problem, turned into a [`ModelError`] once the path is at hand.
pub enum LayoutError {
    Invalid(String),
    Unsupported {
        tensor: String,
        type_name: &'static str,
        type_id: u32,
    },
}

impl LayoutError {
    fn at(self, path: &Path) -> ModelError {
        let path = path.display().to_string();
        match self {
            Self::Invalid(message) => ModelError::InvalidGguf { path, message },
            Self::Unsupported {
                tensor,
                type_name,
                type_id,
            } => ModelError::UnsupportedTensorType {
                name: tensor,
                dtype: format!("{type_name} (id {type_id})"),
            },
        }
    }
}

/// Checks a tensor's dims (GGUF order, innermost first) and type id; returns its type and data size.
pub fn tensor_layout(
    name: &str,
    dims: &[u64],
    type_id: u32,
) -> std::result::Result<(&'static GgmlType, u64), LayoutError> {
    let invalid = |m: String| LayoutError::Invalid(format!("tensor {name}: {m}"));
    if dims.contains(&0) {
        return Err(invalid(format!("dims {dims:?} include a zero")));
    }
    let elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| invalid(format!("dims {dims:?} hold more than 2^50 elements")))?;
    let Some(ty) = ggml_type(type_id) else {
        return Err(invalid(format!("unknown ggml type id {type_id}")));
    };
    let Some((block, type_size)) = ty.layout() else {
        return Err(LayoutError::Unsupported {
            tensor: name.to_string(),
            type_name: ty.name,
            type_id,
        });
    };
    if !dims[0].is_multiple_of(block) {
        return Err(invalid(format!(
            "rows of {} elements are not whole {} blocks of {block}",
            dims[0], ty.name
        )));
    }
    let bytes = (elements / block)
        .checked_mul(type_size)
        .ok_or_else(|| invalid(format!("dims {dims:?} overflow its size in bytes")))?;
    Ok((ty, bytes))
}

fn prealloc(declared: u64) -> usize {
    usize::try_from(declared)
        .unwrap_or(usize::MAX)
        .min(PREALLOC_ELEMENTS)
}

fn value_type(id: u32) -> Option<ValueType> {
    Some(match id {
        0 => ValueType::U8,
        1 => ValueType::I8,
        2 => ValueType::U16,
        3 => ValueType::I16,
        4 => ValueType::U32,
        5 => ValueType::I32,
        6 => ValueType::F32,
        7 => ValueType::Bool,
        8 => ValueType::String,
        9 => ValueType::Array,
        10 => ValueType::U64,
        11 => ValueType::I64,
        12 => ValueType::F64,
        _ => return None,
    })
}

/// Fewest bytes one value of `ty` takes in the file (a string's or array's length prefix alone).
fn min_bytes(ty: ValueType) -> u64 {
    match ty {
        ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
        ValueType::U16 | ValueType::I16 => 2,
        ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
        ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
        ValueType::Array => 4 + 8,
    }
}

/// Describes what is being read, built only when a read fails.
type What<'a> = &'a dyn Fn() -> String;

/// The header's bytes, read through a buffer, with the position and the file's size always known.
struct Source<'a> {
    inner: BufReader<&'a mut File>,
    /// Bytes consumed so far; never more than `size`.
    pos: u64,
    size: u64,
    path: &'a Path,
}

impl Source<'_> {
    fn bad(&self, message: String) -> ModelError {
        ModelError::InvalidGguf {
            path: self.path.display().to_string(),
            message,
        }
    }

    fn left(&self) -> u64 {
        self.size - self.pos
    }

    /// Fails unless `n` more bytes are in the file.
    fn need(&self, n: u64, what: What) -> Result<()> {
        if n > self.left() {
            return Err(self.bad(format!(
                "{} needs {n} bytes at offset {}, but the file ends at {} (truncated?)",
                what(),
                self.pos,
                self.size
            )));
        }
        Ok(())
    }

    fn read_into(&mut self, buf: &mut [u8]) -> Result<()> {
        self.inner
            .read_exact(buf)
            .map_err(|source| ModelError::Io {
                path: self.path.display().to_string(),
                source,
            })?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    fn fixed<const N: usize>(&mut self, what: What) -> Result<[u8; N]> {
        self.need(N as u64, what)?;
        let mut b = [0u8; N];
        self.read_into(&mut b)?;
        Ok(b)
    }

    fn u32(&mut self, what: What) -> Result<u32> {
        self.fixed(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: What) -> Result<u64> {
        self.fixed(what).map(u64::from_le_bytes)
    }

    /// A length-prefixed string; trailing NULs (which some writers add) are dropped, as candle does.
    fn string(&mut self, what: What) -> Result<String> {
        let len = self.u64(&|| format!("the length of {}", what()))?;
        self.need(len, &|| format!("{} (a string of {len} bytes)", what()))?;
        let len = usize::try_from(len)
            .map_err(|_| self.bad(format!("{}: {len} bytes do not fit this machine", what())))?;
        let mut bytes = vec![0u8; len];
        self.read_into(&mut bytes)?;
        while bytes.last() == Some(&0) {
            bytes.pop();
        }
        String::from_utf8(bytes).map_err(|e| {
            self.bad(format!(
                "{} is not valid UTF-8 (bad byte at {})",
                what(),
                e.utf8_error().valid_up_to()
            ))
        })
    }

    fn value_type(&mut self, what: What) -> Result<ValueType> {
        let id = self.u32(&|| format!("the value type of {}", what()))?;
        value_type(id).ok_or_else(|| self.bad(format!("{} has unknown value type {id}", what())))
    }

    fn value(&mut self, ty: ValueType, depth: usize, what: What) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.fixed(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.fixed(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.fixed(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.fixed(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.fixed(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.fixed(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.fixed(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.fixed(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.fixed(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.fixed(what)?)),
            ValueType::Bool => match self.fixed::<1>(what)? {
                [0] => Value::Bool(false),
                [1] => Value::Bool(true),
                [b] => {
                    return Err(self.bad(format!("{} is a bool stored as {b}, not 0 or 1", what())));
                }
            },
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => self.array(depth, what)?,
        })
    }

    fn array(&mut self, depth: usize, what: What) -> Result<Value> {
        if depth >= MAX_DEPTH {
            return Err(self.bad(format!(
                "{} nests arrays more than {MAX_DEPTH} deep",
                what()
            )));
        }
        let elem = self.value_type(&|| format!("the element type of {}", what()))?;
        let len = self.u64(&|| format!("the length of {}", what()))?;
        let min = min_bytes(elem);
        if len.checked_mul(min).is_none_or(|n| n > self.left()) {
            return Err(self.bad(format!(
                "{} declares {len} {elem:?} elements, more than the {} bytes left in the file can hold",
                what(),
                self.left()
            )));
        }
        let mut values = Vec::with_capacity(prealloc(len));
        for i in 0..len {
            values.push(self.value(elem, depth + 1, &|| format!("element {i} of {}", what()))?);
        }
        Ok(Value::Array(values))
    }
}
