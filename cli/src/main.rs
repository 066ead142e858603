//! `kata-topo`: the operator CLI. See `kata-topo --help`.

#![forbid(unsafe_code)]

use std::process::ExitCode;

mod cli;
mod commands;
mod out;

fn main() -> ExitCode {
    cli::run()
}
