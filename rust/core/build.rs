//! Generates the prost types from `proto/` without a system `protoc`:
//! protox parses the schemas in pure Rust and prost-build emits the code.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        "txn_log.proto",
        "pending_ack.proto",
        "tb_snapshot.proto",
        "ledger.proto",
        "terminated.proto",
        "pulsar_api.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let fds = protox::compile(files, [&root])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
