//! `#[pg_test]` tests of the SQL surface, run inside PostgreSQL by `cargo pgrx test`, by
//! concern. The test server preloads the library (`lib.rs`), so shared memory is tested here
//! too.

mod concurrency;
mod helpers;
mod keys;
mod kinds;
mod memory;
mod overrides;
mod shmem;
mod surface;
mod transactions;
mod vectors;
