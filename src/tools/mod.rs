//! The tools of the `specdec` command, beside the library rather than inside its surface: the
//! benchmark (`specdec bench`, `cargo bench`), the self-test (`specdec selftest`) and the
//! statistics (exact χ² quantiles, binomial z-scores) that the self-test and the test suite use.

pub mod bench;
pub mod selftest;
pub mod stats;
