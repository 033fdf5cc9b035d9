//! Recording kernels: [`Commands`] collects dispatches into one command buffer, submitted with
//! [`Commands::submit`]; [`Gpu::read`] waits for it.

use wgpu::util::DeviceExt;

use crate::pipelines::Kernel;
use crate::{Gpu, GpuError, GpuMatrix, GpuVec};

/// The shape of a matrix-vector workgroup, given to the kernel as override constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatvecConfig {
    /// Threads per workgroup (at most 256 and the adapter's limit).
    pub workgroup: u32,
    /// Rows each workgroup computes; `workgroup / rows` threads share a row and must be a power of two.
    pub rows: u32,
}

impl Default for MatvecConfig {
    /// 64 threads, 2 rows: 32 threads per row. Not tuned yet on a real GPU (issue 27).
    fn default() -> Self {
        Self {
            workgroup: 64,
            rows: 2,
        }
    }
}

/// Threads per workgroup of the row kernels (RMS norm, SwiGLU).
const ROW_WG: u32 = 256;

/// A command buffer being recorded on one [`Gpu`].
pub struct Commands<'g> {
    gpu: &'g Gpu,
    encoder: wgpu::CommandEncoder,
}

impl Gpu {
    /// Starts recording kernels.
    pub fn commands(&self) -> Commands<'_> {
        Commands {
            gpu: self,
            encoder: self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("shoal commands"),
                }),
        }
    }

    pub(crate) fn row_workgroup(&self) -> u32 {
        // The largest power of two within both the kernels' workgroup memory and the adapter.
        let mut wg = ROW_WG;
        while wg > self.max_invocations.max(1) {
            wg /= 2;
        }
        wg
    }

    /// A read-only storage buffer of `words` (at least one).
    pub(crate) fn storage_u32(&self, words: &[u32]) -> wgpu::Buffer {
        let mut bytes: Vec<u8> = words.iter().flat_map(|v| v.to_le_bytes()).collect();
        bytes.resize(bytes.len().max(4), 0);
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("shoal u32s"),
                contents: &bytes,
                usage: wgpu::BufferUsages::STORAGE,
            })
    }

    /// The buffer of `v`, or of a new one-value vector for a kernel's optional input that it then
    /// never reads (the binding must be filled).
    pub(crate) fn buffer_or_dummy(&self, v: Option<&GpuVec>) -> Result<wgpu::Buffer, GpuError> {
        Ok(match v {
            Some(v) => v.buffer.clone(),
            None => self.zeros(1)?.buffer,
        })
    }

    /// A uniform buffer of `words` (zero-padded to a multiple of 16 bytes).
    pub(crate) fn uniform(&self, words: &[u32]) -> wgpu::Buffer {
        let mut bytes: Vec<u8> = words.iter().flat_map(|v| v.to_le_bytes()).collect();
        bytes.resize(bytes.len().div_ceil(16).max(1) * 16, 0);
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("shoal params"),
                contents: &bytes,
                usage: wgpu::BufferUsages::UNIFORM,
            })
    }
}

pub(crate) fn same_len(what: &str, a: usize, b: usize) -> Result<(), GpuError> {
    if a == b {
        Ok(())
    } else {
        Err(GpuError::Shape(format!("{what}: {a} values against {b}")))
    }
}

impl<'g> Commands<'g> {
    /// The device these commands are recorded for.
    pub(crate) fn gpu(&self) -> &'g Gpu {
        self.gpu
    }

    /// The encoder the commands are recorded into.
    pub(crate) fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        &mut self.encoder
    }

    /// `y = W · x` with the default [`MatvecConfig`].
    pub fn matvec(&mut self, w: &GpuMatrix, x: &GpuVec, y: &GpuVec) -> Result<(), GpuError> {
        self.matvec_with(w, x, y, MatvecConfig::default())
    }

    /// `y = W · x` (`x` of `w.cols()` values, `y` of `w.rows()`), one dispatch per row chunk.
    pub fn matvec_with(
        &mut self,
        w: &GpuMatrix,
        x: &GpuVec,
        y: &GpuVec,
        config: MatvecConfig,
    ) -> Result<(), GpuError> {
        same_len("matvec input", x.len(), w.cols())?;
        same_len("matvec output", y.len(), w.rows())?;
        let MatvecConfig { workgroup, rows } = config;
        let ok = (1..=256.min(self.gpu.max_invocations)).contains(&workgroup)
            && rows >= 1
            && workgroup % rows == 0
            && (workgroup / rows).is_power_of_two();
        if !ok {
            return Err(GpuError::Config(format!(
                "workgroup {workgroup} with {rows} rows: need workgroup ≤ 256 (and ≤ {}), \
                 a power of two threads per row",
                self.gpu.max_invocations
            )));
        }
        let pipeline = self
            .gpu
            .pipeline(w.kernel(), &[("WG", workgroup), ("ROWS", rows)])?;
        let layout = pipeline.get_bind_group_layout(0);
        let mut groups = Vec::with_capacity(w.chunks.len());
        for chunk in &w.chunks {
            let mut entries = vec![
                entry(0, &chunk.params),
                entry(1, &x.buffer),
                entry(2, &y.buffer),
                entry(3, &chunk.weights),
            ];
            if let Some(s) = &chunk.scales {
                entries.push(entry(4, s));
            }
            if w.qtype().is_iq() {
                entries.push(entry(7, self.gpu.iq_tables()?));
            }
            let bind = self
                .gpu
                .device
                .create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("shoal matvec"),
                    layout: &layout,
                    entries: &entries,
                });
            groups.push((bind, self.gpu.grid(chunk.rows.div_ceil(rows))?));
        }
        let mut pass = self
            .encoder
            .begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        pass.set_pipeline(&pipeline);
        for (bind, (gx, gy)) in &groups {
            pass.set_bind_group(0, bind, &[]);
            pass.dispatch_workgroups(*gx, *gy, 1);
        }
        Ok(())
    }

    /// `y[r] = x[r] / sqrt(mean(x[r]²) + eps) · w` for every row of width `w.len()`.
    pub fn rms_norm(
        &mut self,
        x: &GpuVec,
        w: &GpuVec,
        eps: f32,
        y: &GpuVec,
    ) -> Result<(), GpuError> {
        let n = w.len();
        if n == 0 || !x.len().is_multiple_of(n) {
            return Err(GpuError::Shape(format!(
                "rms_norm: {} values are not rows of width {n}",
                x.len()
            )));
        }
        same_len("rms_norm output", y.len(), x.len())?;
        let rows = (x.len() / n) as u32;
        let params = self.gpu.uniform(&[n as u32, rows, eps.to_bits()]);
        let wg = self.gpu.row_workgroup();
        self.dispatch(
            Kernel::RmsNorm,
            wg,
            &[&params, &x.buffer, &w.buffer, &y.buffer],
            rows,
        )
    }

    /// `y = silu(gate) · up`, elementwise.
    pub fn swiglu(&mut self, gate: &GpuVec, up: &GpuVec, y: &GpuVec) -> Result<(), GpuError> {
        self.gated(gate, up, y, 0)
    }

    /// `y = gelu(gate) · up`, elementwise, GELU's tanh approximation as ggml's CPU computes it
    /// (shoal-model's `geglu`: input and result rounded to f16, exact outside ±10).
    pub fn geglu(&mut self, gate: &GpuVec, up: &GpuVec, y: &GpuVec) -> Result<(), GpuError> {
        self.gated(gate, up, y, 1)
    }

    /// `y = g · sigmoid(1.702 · g) · (u + 1)` with `g = min(gate, 7)`, `u = clamp(up, -7, 7)`,
    /// elementwise: gpt-oss's clamped SwiGLU (shoal-model's `swiglu_oai`).
    pub fn swiglu_oai(&mut self, gate: &GpuVec, up: &GpuVec, y: &GpuVec) -> Result<(), GpuError> {
        self.gated(gate, up, y, 2)
    }

    fn gated(&mut self, gate: &GpuVec, up: &GpuVec, y: &GpuVec, gelu: u32) -> Result<(), GpuError> {
        same_len("gated product up", up.len(), gate.len())?;
        same_len("gated product output", y.len(), gate.len())?;
        let n = gate.len() as u32;
        let params = self.gpu.uniform(&[n]);
        let wg = self.gpu.row_workgroup();
        let buffers = [&params, &gate.buffer, &up.buffer, &y.buffer];
        let constants = [("WG", wg), ("GELU", gelu)];
        self.dispatch_with(Kernel::Swiglu, &constants, &buffers, n.div_ceil(wg))
    }

    /// `y = a + b`, elementwise (the residual add). `y` must be another vector than `a` and `b`.
    pub fn add(&mut self, a: &GpuVec, b: &GpuVec, y: &GpuVec) -> Result<(), GpuError> {
        same_len("add b", b.len(), a.len())?;
        self.add_rows(a, b, y)
    }

    /// `y = a + b` with `b` (a bias of `b.len()` values) added to every row of `a`.
    pub fn add_rows(&mut self, a: &GpuVec, b: &GpuVec, y: &GpuVec) -> Result<(), GpuError> {
        same_len("add output", y.len(), a.len())?;
        if b.is_empty() || !a.len().is_multiple_of(b.len()) {
            return Err(GpuError::Shape(format!(
                "add: {} values are not rows of {}",
                a.len(),
                b.len()
            )));
        }
        let n = a.len() as u32;
        let params = self.gpu.uniform(&[n, b.len() as u32]);
        let wg = self.gpu.row_workgroup();
        let buffers = [&params, &a.buffer, &b.buffer, &y.buffer];
        let constants = [("WG", wg), ("BCAST", u32::from(b.len() != a.len()))];
        self.dispatch_with(Kernel::Add, &constants, &buffers, n.div_ceil(wg))
    }

    /// Copies `rows` rows of `cols` values from `src[src_off + r·src_stride..]` to
    /// `dst[dst_off + r·dst_stride..]` (`dst` another vector than `src`).
    #[allow(clippy::too_many_arguments)] // where from, where to, how much
    pub fn copy_rows(
        &mut self,
        src: &GpuVec,
        (src_off, src_stride): (usize, usize),
        dst: &GpuVec,
        (dst_off, dst_stride): (usize, usize),
        rows: usize,
        cols: usize,
    ) -> Result<(), GpuError> {
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let last = |off: usize, stride: usize| off + (rows - 1) * stride + cols;
        if last(src_off, src_stride) > src.len() || last(dst_off, dst_stride) > dst.len() {
            return Err(GpuError::Shape(format!(
                "copy of {rows} rows of {cols} from {src_off} (stride {src_stride}) of {} to \
                 {dst_off} (stride {dst_stride}) of {}",
                src.len(),
                dst.len()
            )));
        }
        let words = [rows, cols, src_off, src_stride, dst_off, dst_stride]
            .map(|v| u32::try_from(v).unwrap_or(u32::MAX));
        let total = u32::try_from(rows * cols)
            .map_err(|_| GpuError::Shape(format!("{rows} × {cols} values do not fit a u32")))?;
        let params = self.gpu.uniform(&words);
        let buffers = [&params, &src.buffer, &dst.buffer];
        self.dispatch(Kernel::CopyRows, 64, &buffers, total.div_ceil(64))
    }

    /// One dispatch of `groups` workgroups of `kernel` with bindings 0.. = `buffers`.
    pub(crate) fn dispatch(
        &mut self,
        kernel: Kernel,
        wg: u32,
        buffers: &[&wgpu::Buffer],
        groups: u32,
    ) -> Result<(), GpuError> {
        self.dispatch_with(kernel, &[("WG", wg)], buffers, groups)
    }

    /// [`Commands::dispatch`] with any override constants.
    pub(crate) fn dispatch_with(
        &mut self,
        kernel: Kernel,
        constants: &[(&'static str, u32)],
        buffers: &[&wgpu::Buffer],
        groups: u32,
    ) -> Result<(), GpuError> {
        if groups == 0 {
            return Ok(());
        }
        let numbered: Vec<_> = (0u32..).zip(buffers.iter().copied()).collect();
        let grid = self.gpu.grid(groups)?;
        self.dispatch_grid(kernel, constants, &numbered, grid)
    }

    /// One dispatch of a `(x, y)` grid of `kernel`'s workgroups, with the given bindings.
    pub(crate) fn dispatch_grid(
        &mut self,
        kernel: Kernel,
        constants: &[(&'static str, u32)],
        buffers: &[(u32, &wgpu::Buffer)],
        (gx, gy): (u32, u32),
    ) -> Result<(), GpuError> {
        let max = self.gpu.max_groups_per_dim;
        if gx > max || gy > max {
            return Err(GpuError::TooLarge {
                what: "dispatch",
                bytes: u64::from(gx.max(gy)),
                limit: u64::from(max),
            });
        }
        if gx == 0 || gy == 0 {
            return Ok(());
        }
        let pipeline = self.gpu.pipeline(kernel, constants)?;
        let entries: Vec<_> = buffers.iter().map(|&(i, b)| entry(i, b)).collect();
        let bind = self
            .gpu
            .device
            .create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(kernel.name()),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            });
        let mut pass = self
            .encoder
            .begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(gx, gy, 1);
        Ok(())
    }

    /// Submits what was recorded; wgpu's validation errors come back as [`GpuError::Wgpu`].
    pub fn submit(self) -> Result<(), GpuError> {
        let Commands { gpu, encoder } = self;
        gpu.checked(|| gpu.queue.submit([encoder.finish()]))?;
        Ok(())
    }
}

pub(crate) fn entry(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buffer.as_entire_binding(),
    }
}
