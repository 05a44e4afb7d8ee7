//! Throughput of `Cache::get` and `Cache::insert` per policy at 100k objects.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use switchyard_cache::{Cache, PolicyKind};

const OBJECTS: u64 = 100_000;
const SIZE: u64 = 1_024;

fn kinds() -> [PolicyKind; 3] {
    [PolicyKind::Lru, PolicyKind::LFU_DEFAULT, PolicyKind::Gdsf]
}

/// A cache holding exactly `OBJECTS` objects of `SIZE` bytes, keys 0..OBJECTS.
fn full_cache(kind: PolicyKind) -> Cache<u64, u64> {
    let mut c = Cache::with_kind(OBJECTS * SIZE, kind);
    for k in 0..OBJECTS {
        let _ = c.insert(k, k, SIZE, Duration::from_micros(k));
    }
    c
}

fn random_keys(n: usize, range: u64) -> Vec<u64> {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    (0..n).map(|_| rng.random_range(0..range)).collect()
}

/// Zipf(0.9)-distributed keys over `range` objects.
fn zipf_keys(n: usize, range: u64) -> Vec<u64> {
    let mut cdf = Vec::with_capacity(range as usize);
    let mut acc = 0.0;
    for rank in 1..=range {
        acc += 1.0 / (rank as f64).powf(0.9);
        cdf.push(acc);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    (0..n)
        .map(|_| {
            let u = rng.random::<f64>() * acc;
            cdf.partition_point(|&x| x < u).min(range as usize - 1) as u64
        })
        .collect()
}

fn get_hit(c: &mut Criterion) {
    let keys = random_keys(1 << 16, OBJECTS);
    let mut g = c.benchmark_group("get_hit_100k");
    g.throughput(Throughput::Elements(1));
    for kind in kinds() {
        let mut cache = full_cache(kind);
        let mut i = 0usize;
        let mut t = OBJECTS;
        g.bench_function(BenchmarkId::from_parameter(kind.name()), |b| {
            b.iter(|| {
                i = (i + 1) & (keys.len() - 1);
                t += 1;
                black_box(cache.get(&keys[i], Duration::from_micros(t)).copied())
            })
        });
    }
    g.finish();
}

fn insert_evict(c: &mut Criterion) {
    let mut g = c.benchmark_group("insert_evict_100k");
    g.throughput(Throughput::Elements(1));
    for kind in kinds() {
        let mut cache = full_cache(kind);
        let mut next = OBJECTS;
        g.bench_function(BenchmarkId::from_parameter(kind.name()), |b| {
            b.iter(|| {
                next += 1;
                let out = cache.insert(next, next, SIZE, Duration::from_micros(next));
                black_box(out.into_evicted())
            })
        });
    }
    g.finish();
}

/// get, and insert on a miss: Zipf keys over 200k objects, room for 100k.
fn mixed_zipf(c: &mut Criterion) {
    let keys = zipf_keys(1 << 18, 2 * OBJECTS);
    let mut g = c.benchmark_group("get_or_insert_zipf_100k");
    g.throughput(Throughput::Elements(1));
    for kind in kinds() {
        let mut cache = Cache::with_kind(OBJECTS * SIZE, kind);
        let mut i = 0usize;
        let mut t = 0u64;
        g.bench_function(BenchmarkId::from_parameter(kind.name()), |b| {
            b.iter(|| {
                i = (i + 1) & (keys.len() - 1);
                t += 1;
                let now = Duration::from_micros(t);
                let k = keys[i];
                if cache.get(&k, now).is_none() {
                    black_box(cache.insert(k, k, SIZE, now).into_evicted());
                }
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = get_hit, insert_evict, mixed_zipf
}
criterion_main!(benches);
