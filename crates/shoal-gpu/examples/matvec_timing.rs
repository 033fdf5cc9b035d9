//! Times each matrix-vector kernel at a Llama-sized 4096 × 4096 on the first adapter (on lavapipe a
//! correctness oracle, not a speed figure), and prints the weights' bytes per second.
//!
//! `cargo run --release -p shoal-gpu --example matvec_timing [rows cols iterations]`

use std::time::Instant;

use shoal_gpu::Gpu;
use shoal_kernels::{QMatrix, QType, row_bytes};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let (rows, cols, iters) = match args[..] {
        [r, c, i] => (r, c, i),
        _ => (4096, 4096, 10),
    };
    let Some(gpu) = Gpu::open_first()? else {
        println!("no GPU adapter");
        return Ok(());
    };
    let info = gpu.info();
    println!(
        "{} ({}, {}, {})",
        info.name, info.vendor, info.backend, info.driver_info
    );
    for qtype in [QType::F32, QType::F16, QType::Q8_0, QType::Q4_0] {
        // Bytes that decode to finite values in every format (0x3c00 is f16 1.0).
        let mut bytes = vec![0u8; rows * row_bytes(qtype, cols)];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 7 % 251) as u8 & 0x3c;
        }
        let w = gpu.upload_matrix(&QMatrix::new(qtype, rows, cols, &bytes)?)?;
        let x = gpu.upload(&vec![0.5; cols])?;
        let y = gpu.zeros(rows)?;
        let run = |n: usize| -> Result<f64, shoal_gpu::GpuError> {
            let start = Instant::now();
            for _ in 0..n {
                let mut cmds = gpu.commands();
                cmds.matvec(&w, &x, &y)?;
                cmds.submit()?;
            }
            gpu.read(&y)?;
            Ok(start.elapsed().as_secs_f64() / n as f64)
        };
        run(1)?; // compile and warm up
        let t = run(iters)?;
        println!(
            "{:>5} {rows}×{cols}: {:8.3} ms  ({:.2} GB/s of weights, {} chunk(s))",
            qtype.name(),
            t * 1e3,
            bytes.len() as f64 / t / 1e9,
            w.chunks()
        );
    }
    Ok(())
}
