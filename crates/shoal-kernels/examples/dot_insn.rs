//! One weight row · one activation row, `reps` times, on a chosen backend: the program whose
//! instructions `scripts/count-insn-aarch64` counts under qemu (the difference between two
//! repetition counts, per block, against llama.cpp's dot of the same type). With `n m`, a matmul
//! of `n` weight rows × `m` activation rows instead (on the calling thread; the activations
//! quantized once, outside the repetitions): the `i8mm` level's matmul kernels.
//!
//! Usage: `dot_insn <type> <k> <reps> [backend] [n m]` (`type` as ggml names it, e.g. `q4_K`; the
//! weight bytes are arbitrary: the kernels have no branches on values).

use shoal_kernels::{
    Activations, Backend, Parallel, QMatrix, QType, matmul_quantized_with, vec_dot_with,
};

/// Runs every part on the calling thread.
struct Inline;

impl Parallel for Inline {
    fn n_threads(&self) -> usize {
        1
    }
    fn run_parts(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        f(0, 1)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: dot_insn <type> <k> <reps> [backend] [n m]";
    let name = args.get(1).expect(usage);
    let qtype = QType::ALL
        .into_iter()
        .chain(QType::IQ)
        .find(|q| q.name().eq_ignore_ascii_case(name))
        .unwrap_or_else(|| panic!("unknown type {name}"));
    let k: usize = args.get(2).expect(usage).parse().expect("k");
    let reps: usize = args.get(3).expect(usage).parse().expect("reps");
    let backend = match args.get(4).map(String::as_str) {
        None => Backend::detect(),
        Some(b) => Backend::all()
            .into_iter()
            .find(|x| x.name() == b)
            .unwrap_or_else(|| panic!("unknown backend {b}")),
    };
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut bytes = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Small values keep f16 scales finite (the count does not depend on them).
                (seed >> 56) as u8 & 0x3B
            })
            .collect()
    };
    if let (Some(n), Some(m)) = (args.get(5), args.get(6)) {
        let (n, m): (usize, usize) = (n.parse().expect("n"), m.parse().expect("m"));
        let data = bytes(n * qtype.try_row_bytes(k).expect("k"));
        let w = QMatrix::new(qtype, n, k, &data).expect("matrix");
        let xf: Vec<f32> = bytes(m * k).iter().map(|&b| f32::from(b) - 29.0).collect();
        let acts = Activations::quantize(qtype.act_type(), &xf, m, k).expect("activations");
        let mut out = vec![0f32; m * n];
        let mut acc = 0f32;
        for _ in 0..reps {
            matmul_quantized_with(backend, &w, std::hint::black_box(&acts), &mut out, &Inline)
                .expect("matmul");
            acc += out.iter().sum::<f32>();
        }
        println!(
            "{} {} {k} {reps} {n}x{m}: {acc}",
            backend.name(),
            qtype.name()
        );
        return;
    }
    let w = bytes(qtype.try_row_bytes(k).expect("k"));
    let x = bytes(qtype.act_type().try_row_bytes(k).expect("k"));
    let mut acc = 0f32;
    for _ in 0..reps {
        acc += vec_dot_with(backend, qtype, k, std::hint::black_box(&w), &x);
    }
    println!("{} {} {k} {reps}: {acc}", backend.name(), qtype.name());
}
