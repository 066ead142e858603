//! `kata-topo-installer`: see the library's documentation and docs/installer.md.

fn main() -> std::process::ExitCode {
    kata_topo_installer::main()
}
