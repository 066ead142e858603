//! Generates the messages of the kubelet's PodResources API v1 from the `.proto` vendored in
//! `proto/protos/kubelet/` (see the README there for its version and licence), with `protox`
//! (no `protoc`) and `prost-build`. Messages only: the one unary call this crate makes is
//! written by hand in `src/grpc.rs`, without tonic (see the crate's documentation).

use std::path::PathBuf;

const PROTO: &str = "../proto/protos/kubelet/pkg/apis/podresources/v1/api.proto";
const INCLUDE: &str = "../proto/protos/kubelet";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO}");
    let descriptors = protox::compile([PROTO], [INCLUDE])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    prost_build::Config::new()
        .out_dir(&out)
        .compile_fds(descriptors)?;
    Ok(())
}
