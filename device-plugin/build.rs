//! Generates the kubelet's device plugin API v1beta1 — messages and the gRPC services
//! `Registration` and `DevicePlugin`, clients and servers — from the `.proto` vendored in
//! `proto/protos/kubelet/` (see the README there for its version and licence).
//!
//! `protox` compiles the file (no `protoc`), `tonic-prost-build` writes prost's messages and
//! tonic's service code: since tonic 0.14 the prost codegen lives there, not in `tonic-build`.
//! The code is generated here and not in `kata-topo-proto` behind a feature: cargo unifies
//! features across a workspace build, so such a feature would hand tonic to the shim whenever
//! both are built together. The vendored file stays beside containerd's, in one place.

use std::path::PathBuf;

const PROTO: &str = "../proto/protos/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto";
const INCLUDE: &str = "../proto/protos/kubelet";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO}");
    let descriptors = protox::compile([PROTO], [INCLUDE])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .out_dir(&out)
        .compile_fds(descriptors)?;
    Ok(())
}
