//! Generates the protobuf messages from the vendored `.proto` files under `protos/`, with
//! `protox` (a protobuf compiler in Rust: no `protoc` needed) and `prost-build`.

use std::path::PathBuf;

/// Every file whose messages the crate exposes; their imports are found under the include
/// roots below (google/protobuf/* are built into protox).
const FILES: &[&str] = &[
    "protos/containerd/api/runtime/bootstrap/v1/bootstrap.proto",
    "protos/containerd/api/runtime/task/v2/shim.proto",
    "protos/containerd/api/services/ttrpc/events/v1/events.proto",
    "protos/containerd/api/types/runtimeoptions/v1/api.proto",
    "protos/ttrpc/request.proto",
    "protos/nri/pkg/api/api.proto",
];

const INCLUDES: &[&str] = &[
    "protos/containerd/api",
    "protos/ttrpc",
    "protos/googleapis",
    "protos/nri",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=protos");
    let descriptors = protox::compile(FILES, INCLUDES)?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    prost_build::Config::new()
        .out_dir(&out)
        .include_file("protos.rs")
        .compile_fds(descriptors)?;
    Ok(())
}
