//! prost types generated at build time from `proto/*.proto` (see `build.rs`).
//! Field numbers there are the storage compatibility contract.

#![allow(missing_docs, clippy::doc_lazy_continuation, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/txnstream.rs"));
