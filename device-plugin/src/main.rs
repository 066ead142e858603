//! `kata-topo-device-plugin`: the kubelet's device plugin for VFIO devices. See `--help`.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    kata_topo_device_plugin::cli::run()
}
