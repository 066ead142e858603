//! Embeds the git revision in `kata_topo_core::VERSION`, which every binary prints.
use std::process::Command;

fn main() {
    let rev = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=KATA_TOPO_GIT_REV={rev}");
    for head in ["../.git/HEAD", "../.git/refs/heads"] {
        if std::path::Path::new(head).exists() {
            println!("cargo:rerun-if-changed={head}");
        }
    }
}
