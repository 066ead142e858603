//! `kata-topo`: the operator CLI. See `kata-topo --help`.

use std::process::ExitCode;

mod cli;

fn main() -> ExitCode {
    cli::run()
}
