//! The proposers allocate nothing in the steady state: after a warm-up step has grown the
//! reused `Proposals` buffers, further steps of the same shape make no heap allocation. Counted
//! with a global allocator that tallies the calling thread's allocations.

use specdec::speculative::{
    DraftModel, DraftModelProposer, ModelError, NgramProposer, Proposals, Proposer, RowKind,
    SeqView,
};
use specdec::SamplingParams;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> usize {
    let before = ALLOCS.with(|c| c.get());
    f();
    ALLOCS.with(|c| c.get()) - before
}

/// A drafter that allocates nothing itself: proposes the last token again, with uniform rows.
struct Repeat {
    rows: [f32; 64 * 8],
    toks: [u32; 8],
}

impl DraftModel for Repeat {
    fn row_kind(&self) -> RowKind {
        RowKind::Probs
    }
    fn vocab_size(&self) -> usize {
        64
    }
    fn propose(
        &mut self,
        seqs: &[SeqView<'_>],
        caps: &[usize],
        out: &mut Proposals,
    ) -> Result<(), ModelError> {
        for (s, &cap) in seqs.iter().zip(caps) {
            let n = cap.min(8);
            self.toks[..n].fill(*s.tokens.last().unwrap_or(&0));
            out.push(&self.toks[..n], &self.rows[..n * 64])?;
        }
        Ok(())
    }
}

#[test]
fn proposers_do_not_allocate_in_the_steady_state() {
    let seqs_data: Vec<Vec<u32>> = (0..16u32)
        .map(|r| (0..200).map(|i| (i * 7 + r) % 13).collect())
        .collect();
    let seqs: Vec<SeqView<'_>> = seqs_data
        .iter()
        .enumerate()
        .map(|(r, t)| SeqView {
            request: r,
            tokens: t,
            max_len: 205 + r,
            params: SamplingParams::greedy(),
        })
        .collect();
    let mut out = Proposals::default();
    let mut ngram = NgramProposer::new(1, 4).unwrap();
    let mut drafter = DraftModelProposer::new(Repeat {
        rows: [1.0 / 64.0; 64 * 8],
        toks: [0; 8],
    });
    for p in [&mut ngram as &mut dyn Proposer, &mut drafter] {
        p.propose(&seqs, 6, &mut out).unwrap(); // warm-up: the buffers grow here
        assert!(out.tokens.len() > 16, "proposals were made");
        let n = allocations_during(|| {
            for _ in 0..50 {
                p.propose(&seqs, 6, &mut out).unwrap();
            }
        });
        assert_eq!(n, 0, "heap allocations in 50 steady-state steps");
    }
    // The counter works: a fresh buffer allocates.
    assert!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 10]))) > 0);
}
