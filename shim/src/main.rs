//! `containerd-shim-kata-topo-v2`: a containerd shim v2 that forwards every call to the real
//! shim (Kata's, or runc's) and checks `Create` and `Update` against the pod's NUMA and VFIO
//! topology. See the README for how to configure it as a runtime handler.

fn main() -> std::process::ExitCode {
    kata_topo_shim::real_main()
}
