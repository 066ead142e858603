//! kata-topo-nri's link: its relative relocations packed (`DT_RELR`). The binary is
//! position-independent, and unpacked, its 10,000 relocations (one per pointer in its
//! read-only data) are 250 KiB the loader reads into the plugin's memory at every start;
//! packed, a few KiB. It needs a linker with `-z pack-relative-relocs` (binutils 2.38) and runs
//! on glibc 2.36 or later: what the installer's image, where the plugin runs, carries.
fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}
