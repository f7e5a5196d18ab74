//! The safe Rust host of ds4's bridge contract (docs/ARCHITECTURE.md §3, §8).
//!
//! Application → `ds4-core` → `ds4-sys` → `bridge/ds4_bridge.h` → the native engine.
//! [`Model`] and [`Session`] own their handles (freed once, in Drop; a session borrows its
//! model); every fallible call returns [`Result`] carrying the engine's message. The parts the
//! contract gives the host are here in Rust: GGUF identification and the tensor inventory
//! ([`gguf`]), the tables an open can take ([`HostTables`]), the payload prefix codec
//! ([`payload`]), the session ledger ([`ledger`]) and the tokenizer ([`Vocab`]).
mod batch;
mod error;
pub mod gguf;
pub mod ledger;
mod model;
pub mod payload;
mod session;
pub mod tokenizer;
mod unicode;

pub use batch::{Batch, BatchStats};
pub use error::{Error, Result};
pub use gguf::{identify_gguf, GgufIdentity, TensorEntry, TensorInventory};
pub use model::{Backend, HostTables, Model, ModelInfo, NativeGguf, OpenOptions};
pub use session::{PrefillCheckpoint, Sampling, Session};
pub use tokenizer::Vocab;
