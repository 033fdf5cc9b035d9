//! f32 vectors on the device: [`GpuVec`], with [`Gpu::upload`], [`Gpu::zeros`], [`Gpu::write`]
//! and [`Gpu::read`].

use std::sync::mpsc;

use crate::{Gpu, GpuError};

/// `len` f32 values in a storage buffer. The buffer holds a whole number of vec4s (the padding
/// is zero and no kernel writes it), so the matrix-vector kernels read it as `array<vec4<f32>>`.
/// Cloning shares the buffer (a handle, not a copy).
#[derive(Debug, Clone)]
pub struct GpuVec {
    pub(crate) buffer: wgpu::Buffer,
    len: usize,
}

impl GpuVec {
    /// Values held (without the padding).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

pub(crate) fn f32_bytes(data: &[f32]) -> Vec<u8> {
    data.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl Gpu {
    /// A zeroed vector of `len` values.
    pub fn zeros(&self, len: usize) -> Result<GpuVec, GpuError> {
        let bytes = (len.max(1).div_ceil(4) * 16) as u64;
        if bytes > self.max_binding {
            return Err(GpuError::TooLarge {
                what: "vector",
                bytes,
                limit: self.max_binding,
            });
        }
        let buffer = self.checked(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("shoal vector"),
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        Ok(GpuVec { buffer, len })
    }

    /// A vector holding `data`.
    pub fn upload(&self, data: &[f32]) -> Result<GpuVec, GpuError> {
        let v = self.zeros(data.len())?;
        self.write(&v, data)?;
        Ok(v)
    }

    /// Overwrites `v` with `data` (same length), ordered before any later submission.
    pub fn write(&self, v: &GpuVec, data: &[f32]) -> Result<(), GpuError> {
        if data.len() != v.len {
            return Err(GpuError::Shape(format!(
                "writing {} values into a vector of {}",
                data.len(),
                v.len
            )));
        }
        if !data.is_empty() {
            self.queue.write_buffer(&v.buffer, 0, &f32_bytes(data));
        }
        Ok(())
    }

    /// Waits for the work submitted so far and copies `v` back.
    pub fn read(&self, v: &GpuVec) -> Result<Vec<f32>, GpuError> {
        if v.len == 0 {
            return Ok(Vec::new());
        }
        let size = (v.len * 4) as u64;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("shoal readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        encoder.copy_buffer_to_buffer(&v.buffer, 0, &staging, 0, size);
        self.checked(|| self.queue.submit([encoder.finish()]))?;
        let (tx, rx) = mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        rx.recv()
            .map_err(|e| GpuError::Readback(e.to_string()))?
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        let out = {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| GpuError::Readback(e.to_string()))?;
            view.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        };
        staging.unmap();
        Ok(out)
    }
}
