//! GGUF access: metadata getters and reading single tensors by name (raw bytes or candle tensors).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::Device;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};

use crate::error::{ModelError, Result};

/// An open GGUF file: parsed header, tensor directory and a reader for tensor data.
pub struct GgufFile {
    path: PathBuf,
    file: File,
    content: Content,
}

/// A tensor read as raw GGML bytes, dims in GGML order reversed to row-major (`[rows, cols]`).
pub struct RawTensor {
    pub dtype: GgmlDType,
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
        let content = Content::read(&mut file).map_err(|e| ModelError::InvalidGguf {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            content,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn content(&self) -> &Content {
        &self.content
    }

    pub fn value(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
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
        let info = self.content.tensor_infos.get(name)?;
        let dtype = info.ggml_dtype;
        let elems = info.shape.elem_count() as u64;
        Some(elems / dtype.block_size() as u64 * dtype.type_size() as u64)
    }

    /// Names of every tensor in the file.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.content.tensor_infos.keys().map(String::as_str)
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Reads one tensor's raw bytes (only that tensor's bytes are read from disk).
    pub fn read_raw(&mut self, name: &str) -> Result<RawTensor> {
        let info =
            self.content
                .tensor_infos
                .get(name)
                .ok_or_else(|| ModelError::MissingTensor {
                    name: name.to_string(),
                })?;
        let elems = info.shape.elem_count();
        let bs = info.ggml_dtype.block_size();
        if elems % bs != 0 {
            return Err(ModelError::InvalidGguf {
                path: self.path.display().to_string(),
                message: format!("tensor {name}: {elems} elements not a multiple of block {bs}"),
            });
        }
        let size = elems / bs * info.ggml_dtype.type_size();
        let start = self.content.tensor_data_offset + info.offset;
        let mut data = vec![0u8; size];
        let io = |source| ModelError::Io {
            path: self.path.display().to_string(),
            source,
        };
        self.file.seek(SeekFrom::Start(start)).map_err(io)?;
        self.file.read_exact(&mut data).map_err(io)?;
        // candle already stores GGUF dims in row-major order (outermost first).
        let dims = info.shape.dims().to_vec();
        Ok(RawTensor {
            dtype: info.ggml_dtype,
            dims,
            data,
        })
    }

    /// Reads one tensor as a candle quantized tensor on `device`.
    pub fn read_qtensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        if !self.has_tensor(name) {
            return Err(ModelError::MissingTensor {
                name: name.to_string(),
            });
        }
        Ok(self.content.tensor(&mut self.file, name, device)?)
    }

    /// Reads an F32 vector tensor (norm weights).
    pub fn read_f32_vec(&mut self, name: &str) -> Result<Vec<f32>> {
        let raw = self.read_raw(name)?;
        if raw.dtype != GgmlDType::F32 {
            return Err(ModelError::UnsupportedTensorType {
                name: name.to_string(),
                dtype: format!("{:?}", raw.dtype),
            });
        }
        Ok(raw
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}
