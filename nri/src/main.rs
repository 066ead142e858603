//! `kata-topo-nri`: kata-topo's checks as an NRI plugin.

use std::process::ExitCode;

fn main() -> ExitCode {
    kata_topo_nri::real_main()
}
