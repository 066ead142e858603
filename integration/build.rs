//! Generates the messages of Kata's remote hypervisor protocol (`hypervisor.proto`: what
//! Kata's shim asks the test service, `kata-topo-remote-hypervisor`) and of the agent's health
//! service (`health.proto`: the service's readiness check, the call the shim makes first) from
//! the `.proto` files vendored in `proto/protos/kata/` (see the README there), with `protox`
//! (no `protoc`) and `prost-build`. Messages only: the service speaks ttrpc over
//! `kata_topo_proto::wire`.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "../proto/protos/kata/hypervisor.proto",
    "../proto/protos/kata/health.proto",
];
const INCLUDE: &str = "../proto/protos/kata";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, [INCLUDE])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    prost_build::Config::new()
        .out_dir(&out)
        .include_file("kata.rs")
        .compile_fds(descriptors)?;
    Ok(())
}
