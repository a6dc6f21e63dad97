//! `copy_streaming` against an ordinary copy, 1 MiB from a buffer in the
//! cache into memory that is not (a RAM LUN's chunk): the case the RAM
//! backend's whole-chunk writes are in.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const MIB: usize = 1 << 20;
/// Destinations taken in turn: 256 MiB, far more than any cache.
const COLD: usize = 256;

fn copies(c: &mut Criterion) {
    let src: Vec<u8> = (0..MIB).map(|i| (i * 31 + i / 7) as u8).collect();
    let mut dst: Vec<Vec<u8>> = (0..COLD).map(|_| vec![1u8; MIB]).collect();
    let mut g = c.benchmark_group("copy 1 MiB into cold memory");
    g.throughput(Throughput::Bytes(MIB as u64));
    let mut i = 0;
    g.bench_function("copy_from_slice", |b| {
        b.iter(|| {
            i = (i + 1) % COLD;
            dst[i].copy_from_slice(&src);
        });
    });
    g.bench_function("copy_streaming", |b| {
        b.iter(|| {
            i = (i + 1) % COLD;
            bufpool::copy_streaming(&mut dst[i], &src);
        });
    });
    g.finish();
}

criterion_group!(benches, copies);
criterion_main!(benches);
