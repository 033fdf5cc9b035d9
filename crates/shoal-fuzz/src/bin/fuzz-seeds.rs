//! Writes each target's seeds (`shoal_fuzz::seeds`) into `<dir>/<target>/seed-<n>`: what `scripts/fuzz`
//! starts a fuzzer from. Usage: `fuzz-seeds <dir>`.

fn main() {
    let dir = std::env::args()
        .nth(1)
        .expect("usage: fuzz-seeds <corpus dir>");
    for target in shoal_fuzz::TARGETS {
        let seeds = shoal_fuzz::seeds::seeds(target);
        if seeds.is_empty() {
            continue;
        }
        let out = std::path::Path::new(&dir).join(target);
        std::fs::create_dir_all(&out).expect("the corpus folder");
        for (i, seed) in seeds.iter().enumerate() {
            std::fs::write(out.join(format!("seed-{i}")), seed).expect("a seed");
        }
        println!("{target}: {} seeds", seeds.len());
    }
}
