mod common;
use common::*;

#[test]
fn gpu_matches_cpu_on_random_batch() {
    let Some(gpu) = gpu() else { return };
    let mut g = Gen::new(1);
    for kind in 0..3u8 {
        let b = Owned::random(&mut g, 1000, &[0, 3, 1, 4, 2], &[0.0, 1.0, 0.7], kind, 0.7);
        let a = cpu().verify_blocking(&b.batch()).unwrap();
        let c = gpu.verify_blocking(&b.batch()).unwrap();
        assert_eq!(a, c, "kind {kind}");
        println!("{:?}", c.tokens);
    }
}
