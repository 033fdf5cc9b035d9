//! Matmul micro-benchmarks at SmolLM2-135M shapes.
//!
//! `cargo run -p shoal-kernels --example kernel_bench --release [-- --quick] [--only=SECTION]`
//! (sections: `shapes`, `hot`, `handoff`, `token`, `prefill`)
//!
//! Prints, per shape and thread count, µs per call (best and median wall time, on-CPU time) and
//! the GB/s of weight bytes read.
//! Each shape cycles through enough copies of its weights to total ~64 MB (like one decode step
//! of the model, which does not fit in L2), so weights stream from L3/DRAM as in real decoding.
//! Then it simulates one decode token (30 layers × q, k, v, o, gate, up, down + the Q8_0 output
//! head, all distinct weights) and compares the dedicated pool with rayon and the backends.

#[path = "shared/timing.rs"]
mod timing;

use std::hint::black_box;

use timing::{Timing, time_us};

use shoal_kernels::{
    Activations, Backend, PackedMatrix, Parallel, QMatrix, QType, RayonCurrent, ThreadPool, matmul,
    matmul_quantized_with, row_bytes,
};
use shoal_testkit::rng::{Draw, SplitMix64};

struct Shape {
    name: &'static str,
    qtype: QType,
    n: usize,
    k: usize,
}

const SHAPES: [Shape; 5] = [
    Shape {
        name: "attn q/o 576x576",
        qtype: QType::Q4_1,
        n: 576,
        k: 576,
    },
    Shape {
        name: "attn k/v 192x576",
        qtype: QType::Q4_1,
        n: 192,
        k: 576,
    },
    Shape {
        name: "ffn gate/up 1536x576",
        qtype: QType::Q4_1,
        n: 1536,
        k: 576,
    },
    Shape {
        name: "ffn down 576x1536",
        qtype: QType::Q4_1,
        n: 576,
        k: 1536,
    },
    Shape {
        name: "lm_head 49152x576",
        qtype: QType::Q8_0,
        n: 49152,
        k: 576,
    },
];

/// Random but valid block bytes (f16 scales kept small and finite).
fn weights(qtype: QType, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut data = SplitMix64::new(seed).bytes(n * row_bytes(qtype, k));
    let block = qtype.type_size();
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    for b in data.chunks_exact_mut(block) {
        b[..2].copy_from_slice(&scale);
        if qtype == QType::Q4_1 {
            b[2..4].copy_from_slice(&half::f16::from_f32(-0.08).to_le_bytes());
        }
    }
    data
}

fn bench_shape<P: Parallel + ?Sized>(s: &Shape, m: usize, pool: &P, batch_s: f64) -> Timing {
    let bytes = s.n * row_bytes(s.qtype, s.k);
    let copies = (64 << 20) / bytes + 1;
    let mats: Vec<Vec<u8>> = (0..copies)
        .map(|c| weights(s.qtype, s.n, s.k, c as u64 + 1))
        .collect();
    let x: Vec<f32> = (0..m * s.k)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut out = vec![0f32; m * s.n];
    time_us(9, batch_s, |i| {
        let w = QMatrix {
            qtype: s.qtype,
            rows: s.n,
            cols: s.k,
            data: &mats[i % copies],
        };
        matmul(&w, black_box(&x), m, &mut out, pool).expect("matmul");
        black_box(&out);
    })
}

/// The matmuls of one decode token of SmolLM2-135M, each layer with its own weights.
struct Model {
    layers: Vec<[Vec<u8>; 7]>,
    head: Vec<u8>,
}

const LAYER_SHAPES: [(usize, usize); 7] = [
    (576, 576),
    (192, 576),
    (192, 576),
    (576, 576),
    (1536, 576),
    (1536, 576),
    (576, 1536),
];

impl Model {
    fn new() -> Self {
        let layers = (0..30u64)
            .map(|l| {
                LAYER_SHAPES.map(|(n, k)| weights(QType::Q4_1, n, k, l * 10 + n as u64 + k as u64))
            })
            .collect();
        Self {
            layers,
            head: weights(QType::Q8_0, 49152, 576, 999),
        }
    }

    fn bytes(&self) -> usize {
        self.layers.iter().flatten().map(Vec::len).sum::<usize>() + self.head.len()
    }

    /// The weights laid out for `backend` (16-row groups for AVX-512 VNNI, rows otherwise).
    fn packed(&self, backend: Backend) -> PackedModel {
        let pack = |qtype, rows, cols, data: &[u8]| {
            let w = QMatrix::new(qtype, rows, cols, data).expect("matrix");
            PackedMatrix::with_backend(&w, backend).expect("pack")
        };
        PackedModel {
            layers: self
                .layers
                .iter()
                .map(|l| {
                    std::array::from_fn(|i| {
                        let (n, k) = LAYER_SHAPES[i];
                        pack(QType::Q4_1, n, k, &l[i])
                    })
                })
                .collect(),
            head: pack(QType::Q8_0, 49152, 576, &self.head),
        }
    }
}

struct PackedModel {
    layers: Vec<[PackedMatrix; 7]>,
    head: PackedMatrix,
}

impl PackedModel {
    /// One token; `acts` per input width, quantized once per distinct input as the engine does.
    fn token<P: Parallel + ?Sized>(&self, pool: &P, m: usize, bufs: &mut Bufs) {
        let mm = |w: &PackedMatrix, a: &Activations, out: &mut Vec<f32>| {
            out.resize(a.m() * w.rows(), 0.0);
            w.matmul_quantized(a, out, pool).expect("matmul");
        };
        for l in &self.layers {
            bufs.a576
                .quantize_into(QType::Q4_1.act_type(), &bufs.x576, m, 576)
                .expect("q");
            for (i, w) in l.iter().enumerate() {
                match i {
                    3 => mm(w, &bufs.a576, &mut bufs.out), // o: input is the attention output
                    6 => {
                        bufs.a1536
                            .quantize_into(QType::Q4_1.act_type(), &bufs.x1536, m, 1536)
                            .expect("q");
                        mm(w, &bufs.a1536, &mut bufs.out)
                    }
                    _ => mm(w, &bufs.a576, &mut bufs.out),
                }
            }
        }
        bufs.h576
            .quantize_into(QType::Q8_0.act_type(), &bufs.x576, m, 576)
            .expect("q");
        mm(&self.head, &bufs.h576, &mut bufs.out);
        black_box(&bufs.out);
    }
}

struct Bufs {
    x576: Vec<f32>,
    x1536: Vec<f32>,
    a576: Activations,
    a1536: Activations,
    h576: Activations,
    out: Vec<f32>,
}

impl Bufs {
    fn new(m: usize) -> Self {
        let v = |n: usize| {
            (0..n)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect()
        };
        Self {
            x576: v(m * 576),
            x1536: v(m * 1536),
            a576: Activations::default(),
            a1536: Activations::default(),
            h576: Activations::default(),
            out: Vec::new(),
        }
    }
}

/// Command line: `--quick` (shorter batches), `--only=SECTION` (`shapes`, `hot`, `handoff`,
/// `token`, `prefill`; repeatable).
struct Args {
    batch_s: f64,
    batches: usize,
    only: Vec<String>,
}

impl Args {
    fn parse() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let quick = args.iter().any(|a| a == "--quick");
        let only = args
            .iter()
            .filter_map(|a| a.strip_prefix("--only=").map(str::to_owned))
            .collect();
        Self {
            batch_s: if quick { 0.05 } else { 0.2 },
            batches: if quick { 3 } else { 9 },
            only,
        }
    }

    fn wants(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == section)
    }
}

fn main() {
    let args = Args::parse();
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    println!(
        "backend: {:?} (supported: {:?})",
        Backend::detect(),
        Backend::supported()
    );
    println!("times per call: best and median wall time over batches, and the caller's on-CPU");
    println!("time (on a shared machine the 1-thread on-CPU time is the kernel's own speed;");
    println!("2-thread runs need two idle cores to mean anything)");
    if args.wants("shapes") {
        shapes(&args, &pools);
    }
    if args.wants("hot") {
        hot(&args, &pools[0]);
    }
    if args.wants("handoff") {
        handoff(&args, &pools);
    }
    if args.wants("token") || args.wants("prefill") {
        let model = Model::new();
        if args.wants("token") {
            token(&args, &pools, &model);
        }
        if args.wants("prefill") {
            prefill(&args, &pools, &model);
        }
    }
}

fn shapes(args: &Args, pools: &[ThreadPool]) {
    println!("\n== matmul at m = 1, weights cycling through ~64 MB of copies (streamed) ==");
    println!(
        "{:<22} {:>3} {:>9} {:>9} {:>9} {:>10} {:>9}",
        "shape", "thr", "best µs", "median", "cpu µs", "GB/s best", "GB/s cpu"
    );
    for s in &SHAPES {
        let bytes = (s.n * row_bytes(s.qtype, s.k)) as f64;
        for pool in pools {
            let t = bench_shape(s, 1, pool, args.batch_s);
            let (gb, gc) = (bytes / t.best / 1e3, bytes / t.cpu / 1e3);
            let (name, nt) = (s.name, pool.n_threads());
            println!(
                "{name:<22} {nt:>3} {:>9.2} {:>9.2} {:>9.2} {gb:>10.2} {gc:>9.2}",
                t.best, t.median, t.cpu
            );
        }
    }
}

fn hot(args: &Args, pool: &ThreadPool) {
    println!("\n== compute speed, 1 thread, weights hot in L2 (on-CPU ns per block · row) ==");
    for s in &SHAPES {
        let n = s.n.min(1024);
        let data = weights(s.qtype, n, s.k, 7);
        let w = QMatrix {
            qtype: s.qtype,
            rows: n,
            cols: s.k,
            data: &data,
        };
        let mut line = format!("{:<22}", s.name);
        for m in [1, 4, 16] {
            let x: Vec<f32> = (0..m * s.k).map(|i| (i % 13) as f32 - 6.0).collect();
            let acts = Activations::quantize(s.qtype.act_type(), &x, m, s.k).expect("acts");
            let mut out = vec![0f32; m * n];
            for backend in Backend::supported()
                .into_iter()
                .filter(|b| *b != Backend::Scalar)
            {
                let t = time_us(5, args.batch_s, |_| {
                    matmul_quantized_with(backend, &w, &acts, &mut out, pool).expect("matmul")
                });
                let ns = t.cpu * 1e3 / (n * s.k / 32 * m) as f64;
                line += &format!("  m={m:<2} {}: {ns:.3}", backend.name());
            }
        }
        println!("{line}");
    }
}

fn handoff(args: &Args, pools: &[ThreadPool]) {
    println!("\n== hand-off cost of an empty job (µs, best / median) ==");
    let noop = |t: usize, _: usize| {
        black_box(t);
    };
    for pool in pools {
        let t = time_us(9, args.batch_s, |_| pool.run(noop));
        println!(
            "ThreadPool({}): {:.3} / {:.3}",
            pool.n_threads(),
            t.best,
            t.median
        );
    }
    let rayon2 = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("rayon");
    let t = rayon2.install(|| time_us(9, args.batch_s, |_| RayonCurrent.run_parts(&noop)));
    println!(
        "rayon(2), caller inside install: {:.3} / {:.3}",
        t.best, t.median
    );
    let t = time_us(9, args.batch_s, |_| {
        rayon2.install(|| RayonCurrent.run_parts(&noop))
    });
    println!(
        "rayon(2), install per call from outside: {:.3} / {:.3}",
        t.best, t.median
    );
}

fn report_header(title: &str) {
    println!("\n== {title} ==");
    println!(
        "{:<28} {:>4} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "pool / backend", "m", "best ms", "median", "cpu ms", "GB/s", "tok/s best"
    );
}

fn report(model: &Model, label: &str, m: usize, t: Timing) {
    let (gbs, tps) = (model.bytes() as f64 / t.best / 1e3, m as f64 * 1e6 / t.best);
    let (best, median, cpu) = (t.best / 1e3, t.median / 1e3, t.cpu / 1e3);
    println!("{label:<28} {m:>4} {best:>9.3} {median:>9.3} {cpu:>9.3} {gbs:>9.2} {tps:>10.1}");
}

fn token(args: &Args, pools: &[ThreadPool], model: &Model) {
    let mb = model.bytes() as f64 / 1e6;
    report_header(&format!(
        "one decode step: 30 × (q k v o gate up down) Q4_1 + Q8_0 head, {mb:.1} MB of weights"
    ));
    let rayon2 = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("rayon");
    let packed: Vec<(Backend, PackedModel)> = Backend::supported()
        .into_iter()
        .rev()
        .map(|b| (b, model.packed(b)))
        .collect();
    let best = &packed[0].1;
    for m in [1, 4, 16] {
        let mut bufs = Bufs::new(m);
        for (backend, pm) in &packed {
            let backend = *backend;
            if backend == Backend::Scalar && m > 1 {
                continue;
            }
            for pool in pools {
                let t = time_us(args.batches, args.batch_s * 2.0, |_| {
                    pm.token(pool, m, &mut bufs)
                });
                report(
                    model,
                    &format!("ThreadPool({}) {}", pool.n_threads(), backend.name()),
                    m,
                    t,
                );
            }
        }
        let t = rayon2.install(|| {
            time_us(args.batches, args.batch_s * 2.0, |_| {
                best.token(&RayonCurrent, m, &mut bufs)
            })
        });
        let name = packed[0].0.name();
        report(model, &format!("rayon(2) in install {name}"), m, t);
    }
}

fn prefill(args: &Args, pools: &[ThreadPool], model: &Model) {
    report_header(&format!(
        "batches of 16 to prefill-sized, 256-bit VNNI vs the best backend ({})",
        Backend::detect().name()
    ));
    let backends = [Backend::AvxVnni, Backend::detect()];
    let packed: Vec<(Backend, PackedModel)> = Backend::supported()
        .into_iter()
        .filter(|b| backends.contains(b))
        .map(|b| (b, model.packed(b)))
        .collect();
    for m in [16, 64, 256] {
        let mut bufs = Bufs::new(m);
        for (backend, pm) in &packed {
            for pool in pools {
                let t = time_us(3, args.batch_s, |_| pm.token(pool, m, &mut bufs));
                let label = format!("ThreadPool({}) {}", pool.n_threads(), backend.name());
                report(model, &label, m, t);
            }
        }
    }
}
